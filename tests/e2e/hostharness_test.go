package e2e

// The harness of TestMaliciousHost (malicious_test.go): it plays the host
// against a real pod VM without containerd. It boots the VM with the
// shim's own library (shim/sandbox, the sim TEE's host side included),
// builds container disks as the shim does (shim/rootfs), writes the OCI
// specs containerd's CRI would, and speaks the raw agent API (Agent, IO,
// PortForward) over the real agent channel, so that it can send what no
// honest shim sends. A pod may get a virtio-fs share run as the shim runs
// it (shim/sharedfs: a virtiofsd per pod serving its directory of the
// state dir, host paths bind-mounted in under entry names).

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/shim/rootfs"
	"github.com/c8s-dev/c8s/shim/sandbox"
	"github.com/c8s-dev/c8s/shim/sharedfs"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

// hostNamespace is the containerd namespace the harness's pods are filed
// under in the state dir, as the shim files a pod under its namespace.
const hostNamespace = "malicious-host"

// imagePath is the image's PATH, which every process of the test pods has.
var imagePath = ociimage.Env[0]

// hostEnv is the node of the harness: a runtime.state_dir, the guest image
// of `make image`, and a busybox tree that container disks are built from.
type hostEnv struct {
	root     string // temporary dir holding the rest
	imageDir string // _output/image
	stateDir string // runtime.state_dir
	diskDir  string // the containers' root disks
	tree     string // the container image's root filesystem
	config   string // the c8s configuration (TOML)
}

// newHostEnv checks the prerequisites (skipping, or failing under
// C8S_E2E_REQUIRED=1, without them) and sets up the node. At cleanup it
// checks that no QEMU of its pods and nothing in its state dir is left,
// then removes everything.
func newHostEnv(t *testing.T) *hostEnv {
	t.Helper()
	repo, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	imageDir := filepath.Join(repo, "_output", "image")
	for _, f := range []string{"vmlinuz", "initrd.img", manifest.FileName} {
		if _, err := os.Stat(filepath.Join(imageDir, f)); err != nil {
			containerdtest.SkipOrFail(t, "%s is missing: run make image", filepath.Join(imageDir, f))
		}
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		containerdtest.SkipOrFail(t, "qemu-system-x86_64 not found: run make deps")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		containerdtest.SkipOrFail(t, "mkfs.ext4 not found: run make deps")
	}
	if _, err := os.Stat(ociimage.DefaultBusybox); err != nil {
		containerdtest.SkipOrFail(t, "%s is missing: install busybox-static (make deps)", ociimage.DefaultBusybox)
	}
	if _, err := os.Stat(virtiofsd); err != nil {
		containerdtest.SkipOrFail(t, "%s is missing: install qemu-system-common (make deps)", virtiofsd)
	}
	// The harness's sandboxes run in this test, not in a shim: their
	// attestation's verifier is the repository's c8s-verify.
	verifier := filepath.Join(repo, "bin", "c8s-verify")
	if _, err := os.Stat(verifier); err != nil {
		containerdtest.SkipOrFail(t, "%s is missing: run make build", verifier)
	}
	sandbox.Verifier = verifier
	// Short: runtime.state_dir must leave room for the VMs' unix sockets.
	root, err := os.MkdirTemp("", "c8s-mh-")
	if err != nil {
		t.Fatal(err)
	}
	h := &hostEnv{root: root, imageDir: imageDir, stateDir: filepath.Join(root, "state"),
		diskDir: filepath.Join(root, "disks"), tree: filepath.Join(root, "tree")}
	t.Cleanup(func() {
		if h.assertNothingLeft(t) {
			os.RemoveAll(root)
		}
	})
	h.config = fmt.Sprintf(`
[hypervisor]
kernel = %q
initrd = %q
tee = "sim"
accel = "auto"

[runtime]
state_dir = %q
`, filepath.Join(imageDir, "vmlinuz"), filepath.Join(imageDir, "initrd.img"), h.stateDir)
	if err := writeBusyboxTree(h.tree); err != nil {
		t.Fatal(err)
	}
	return h
}

// writeBusyboxTree writes the root filesystem of the test image: Debian's
// static busybox and the applets the pods run.
func writeBusyboxTree(dir string) error {
	for _, d := range []string{"bin", "proc", "dev", "sys", "etc", "tmp", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	bb, err := os.ReadFile(ociimage.DefaultBusybox)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), bb, 0o755); err != nil {
		return err
	}
	for _, a := range []string{"sh", "cat", "echo", "sleep", "httpd", "netstat", "id", "true"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "etc", "hostname"), []byte("pod\n"), 0o644)
}

// processes lists the QEMU and virtiofsd processes of the harness's pods
// ("pid command").
func (h *hostEnv) processes() []string {
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(data), "\x00", " ")
		if strings.Contains(cmd, h.root) {
			for _, name := range []string{"qemu-system", "virtiofsd"} {
				if strings.Contains(cmd, name) {
					found = append(found, filepath.Base(filepath.Dir(p))+" "+name)
					break
				}
			}
		}
	}
	return found
}

// mounts lists the mount points below the harness's root (the shares'
// binds of host paths).
func (h *hostEnv) mounts(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == h.root || strings.HasPrefix(f[4], h.root+"/")) {
			found = append(found, f[4])
		}
	}
	return found
}

// assertNothingLeft checks that no QEMU or virtiofsd of the harness's
// pods runs, that nothing is mounted below its root, and that only
// node-wide state (the probe cache, the sim TEE's identity) and empty
// directories are left in the state dir. It reports whether the root may
// be removed: not through a mount, which would delete what it shows.
func (h *hostEnv) assertNothingLeft(t *testing.T) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(h.processes()) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if pids := h.processes(); len(pids) > 0 {
		t.Errorf("processes left behind: %v", pids)
	}
	mounted := h.mounts(t)
	if len(mounted) > 0 {
		t.Errorf("mounts left behind (%s kept): %v", h.root, mounted)
	}
	var left []string
	filepath.Walk(h.stateDir, func(path string, info os.FileInfo, err error) error {
		if err != nil || path == h.stateDir {
			return nil
		}
		rel, _ := filepath.Rel(h.stateDir, path)
		if rel == "cache" || rel == "node" {
			return filepath.SkipDir
		}
		if !info.IsDir() {
			left = append(left, rel)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("left in the c8s state dir: %v", left)
	}
	return len(mounted) == 0
}

// hostPod is one pod VM the harness drives.
type hostPod struct {
	sb       *sandbox.Sandbox
	cfg      config.Config
	initData []byte
	disks    map[string]vm.DiskAddress // by disk name
	// share is the pod's virtio-fs share, or nil; shared maps the host
	// paths bind-mounted into it to their entry names.
	share  *sharedfs.Share
	shared map[string]string
}

// virtioFS says whether a pod VM gets a virtio-fs share.
type virtioFS bool

const (
	noVirtioFS   virtioFS = false
	withVirtioFS virtioFS = true
)

// boot starts pod id's VM with initData measured into its HOST_DATA and a
// root disk per name in disks, built from the busybox tree, attached at
// boot as the shim attaches a pod's first. With fs, it first starts the
// pod's virtio-fs share as the shim does (shim/task/sharedfs.go: a
// virtiofsd from shim/sharedfs serving the pod's directory of the state
// dir) and gives it to the VM. It connects to the agent and, at cleanup,
// stops the VM, then the share (unmounting the host paths shared).
func (h *hostEnv) boot(t *testing.T, ctx context.Context, id string, initData []byte, fs virtioFS, disks ...string) *hostPod {
	t.Helper()
	cfgp, err := config.Parse([]byte(h.config))
	if err != nil {
		t.Fatal(err)
	}
	cfg := *cfgp
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// As the shim does for a pod with init data (shim/task/pod.go).
	d, dt := initdata.Digest(initData), initdata.DigestTDX(initData)
	cfg.Hypervisor.SNP.HostData = hex.EncodeToString(d[:])
	cfg.Hypervisor.TDX.MRConfigID = hex.EncodeToString(dt[:])
	var vmDisks []vm.Disk
	for _, name := range disks {
		path := filepath.Join(h.diskDir, id, name+".img")
		if err := rootfs.Build(ctx, nil, h.tree, path, rootfs.Options{}); err != nil {
			t.Fatal(err)
		}
		vmDisks = append(vmDisks, vm.Disk{ID: id + "-" + name, Path: path})
	}
	dirs := statedir.ForPod(cfg.Runtime.StateDir, hostNamespace, id)
	var (
		share   *sharedfs.Share
		vmShare *vm.SharedFS
	)
	if fs {
		var err error
		if share, err = sharedfs.Start(ctx, virtiofsd, dirs.FS); err != nil {
			t.Fatalf("pod %s: %v", id, err)
		}
		// Registered first, so run after the VM's stop.
		t.Cleanup(func() {
			if err := share.Close(); err != nil {
				t.Errorf("close the virtio-fs share of pod %s: %v", id, err)
			}
			os.Remove(filepath.Dir(dirs.FS)) // as the shim, once no other pod shares
		})
		vmShare = &vm.SharedFS{Socket: share.Socket(), Tag: sharedfs.Tag}
	}
	ctx = namespaces.WithNamespace(ctx, hostNamespace)
	t0 := time.Now()
	sb, err := sandbox.Start(ctx, sandbox.Options{
		ID:       id,
		StateDir: dirs.VM,
		Config:   cfg,
		InitData: initData,
		Disks:    vmDisks,
		SharedFS: vmShare,
	})
	if err != nil {
		t.Fatalf("boot pod VM %s: %v", id, err)
	}
	t.Cleanup(func() {
		if err := sb.Stop(context.Background()); err != nil {
			t.Errorf("stop pod VM %s: %v", id, err)
		}
		os.RemoveAll(filepath.Join(h.diskDir, id))
	})
	t.Logf("pod VM %s up in %v (agent %s, kernel %s)", id, time.Since(t0).Round(time.Millisecond), sb.Info.AgentVersion, sb.Info.KernelRelease)
	p := &hostPod{sb: sb, cfg: cfg, initData: initData, disks: map[string]vm.DiskAddress{}, share: share, shared: map[string]string{}}
	for i, name := range disks {
		addr, err := sb.AttachDisk(ctx, vmDisks[i])
		if err != nil {
			t.Fatal(err)
		}
		p.disks[name] = addr
	}
	return p
}

// shareHostPath bind-mounts host path src into the pod's virtio-fs share
// as entry name, as the shim shares a container's host-path bind mount
// (shim/task/sharedfs.go); from then on each request whose spec binds src
// names that entry (CreateContainerRequest.shared_mounts), and the guest
// binds the entry in place of src. Closing the share unmounts it.
func (p *hostPod) shareHostPath(t *testing.T, src, name string, readOnly bool) {
	t.Helper()
	if p.share == nil {
		t.Fatal("the pod has no virtio-fs share")
	}
	if err := p.share.Add(src, name, readOnly); err != nil {
		t.Fatal(err)
	}
	p.shared[src] = name
}

// createRequest is a CreateContainerRequest for container id of pod
// sandboxID with spec s, its root on disk, and the share's entry for
// each host path of s that shareHostPath shared.
func (p *hostPod) createRequest(t *testing.T, id, sandboxID string, s *specs.Spec, disk string) *agent.CreateContainerRequest {
	t.Helper()
	addr, ok := p.disks[disk]
	if !ok {
		t.Fatalf("no disk %q", disk)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var shared []*agent.SharedMount
	for _, m := range s.Mounts {
		name, ok := p.shared[m.Source]
		if ok && !slices.ContainsFunc(shared, func(sm *agent.SharedMount) bool { return sm.Source == m.Source }) {
			shared = append(shared, &agent.SharedMount{Source: m.Source, Name: name})
		}
	}
	return &agent.CreateContainerRequest{
		ContainerId: id,
		SandboxId:   sandboxID,
		Spec:        raw,
		Rootfs: &agent.Rootfs{
			Source: &agent.Rootfs_Scsi{Scsi: &agent.ScsiDisk{Target: uint32(addr.Target), Lun: uint32(addr.LUN)}},
			Fstype: rootfs.FSType,
		},
		Stdio:        &agent.Stdio{Stdout: true, Stderr: true},
		SharedMounts: shared,
	}
}

// run creates and starts container id.
func (p *hostPod) run(t *testing.T, ctx context.Context, id, sandboxID string, s *specs.Spec, disk string) {
	t.Helper()
	if _, err := p.sb.Agent.CreateContainer(ctx, p.createRequest(t, id, sandboxID, s, disk)); err != nil {
		t.Fatalf("create container %s: %v", id, errgrpc.ToNative(err))
	}
	if _, err := p.sb.Agent.StartContainer(ctx, &agent.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("start container %s: %v", id, errgrpc.ToNative(err))
	}
}

// createRefused asks for container id of spec s and checks that the
// agent refuses it as want, naming names (refused); a container the
// agent created anyway is removed.
func (p *hostPod) createRefused(t *testing.T, ctx context.Context, id, sandboxID string, s *specs.Spec, disk string, want error, names ...string) {
	t.Helper()
	_, err := p.sb.Agent.CreateContainer(ctx, p.createRequest(t, id, sandboxID, s, disk))
	if err == nil {
		if _, rerr := p.sb.Agent.RemoveContainer(ctx, &agent.RemoveContainerRequest{ContainerId: id}); rerr != nil {
			t.Errorf("remove container %s, which the guest should have refused: %v", id, errgrpc.ToNative(rerr))
		}
	}
	refused(t, err, want, names...)
}

// refused checks that err, the agent's answer to an attack, is a refusal
// of the errdefs class want (as errgrpc.ToNative restores it on the
// host), and that its message names each of names: what was refused and
// the rule that refused it.
func refused(t *testing.T, err error, want error, names ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the guest did what the host asked; want it refused as %v, naming %q", want, names)
	}
	native := errgrpc.ToNative(err)
	if !errors.Is(native, want) {
		t.Fatalf("refused as %v, want %v: %v", classOf(native), want, native)
	}
	for _, n := range names {
		if !strings.Contains(native.Error(), n) {
			t.Errorf("the refusal does not name %q: %v", n, native)
		}
	}
	t.Logf("refused (%v): %v", want, native)
}

// classOf names the errdefs class of err.
func classOf(err error) string {
	for _, c := range []error{errdefs.ErrPermissionDenied, errdefs.ErrFailedPrecondition, errdefs.ErrNotFound, errdefs.ErrInvalidArgument, errdefs.ErrUnavailable, errdefs.ErrAlreadyExists} {
		if errors.Is(err, c) {
			return c.Error()
		}
	}
	return "unclassified"
}

// criSpec is the OCI spec containerd's CRI writes for a container of the
// test image (before the guest adapts it): the standard mounts, the
// default capabilities, masked and read-only paths, its own namespaces,
// the annotations that name it.
func criSpec(annotations map[string]string, args ...string) *specs.Spec {
	caps := func() []string { return append([]string(nil), policyapi.DefaultCapabilities...) }
	return &specs.Spec{
		Version:     specs.Version,
		Annotations: annotations,
		Root:        &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Args: args,
			Env:  []string{imagePath},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps(), Effective: caps(), Permitted: caps(),
			},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			MaskedPaths:   append([]string(nil), policyapi.DefaultMaskedPaths...),
			ReadonlyPaths: append([]string(nil), policyapi.DefaultReadonlyPaths...),
			Resources:     &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
		},
	}
}

// sandboxSpec is the pod's sandbox container (CRI type "sandbox").
func sandboxSpec(args ...string) *specs.Spec {
	return criSpec(map[string]string{
		policy.AnnotationContainerType:    policy.ContainerTypeSandbox,
		policy.AnnotationSandboxImageName: image,
	}, args...)
}

// containerSpec is CRI container name of the pod: with joinSandbox, in
// the sandbox's network, IPC and UTS namespaces, as CRI writes them (the
// host's paths, which the guest replaces by the sandbox's).
func containerSpec(name string, joinSandbox bool, args ...string) *specs.Spec {
	s := criSpec(map[string]string{
		policy.AnnotationContainerType: policy.ContainerTypeContainer,
		policy.AnnotationContainerName: name,
		policy.AnnotationImageName:     image,
	}, args...)
	if joinSandbox {
		for i, ns := range s.Linux.Namespaces {
			switch ns.Type {
			case specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace:
				s.Linux.Namespaces[i].Path = "/proc/1/ns/" + map[specs.LinuxNamespaceType]string{
					specs.NetworkNamespace: "net", specs.IPCNamespace: "ipc", specs.UTSNamespace: "uts"}[ns.Type]
			}
		}
	}
	return s
}

// processJSON is the OCI process of an exec of argv.
func processJSON(t *testing.T, argv ...string) []byte {
	t.Helper()
	raw, err := json.Marshal(specs.Process{Args: argv, Env: []string{imagePath}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// readOutput reads a process's stdout until it holds want or ends.
func readOutput(ctx context.Context, io agent.IOService, id, execID, want string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var out strings.Builder
	for !strings.Contains(out.String(), want) {
		r, err := io.ReadStdout(ctx, &agent.ReadStreamRequest{ContainerId: id, ExecId: execID})
		if err != nil {
			return out.String(), errgrpc.ToNative(err)
		}
		out.Write(r.Data)
		if r.Eof {
			break
		}
	}
	return out.String(), nil
}
