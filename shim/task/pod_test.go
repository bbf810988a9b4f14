package task

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
	"github.com/c8s-dev/c8s/shim/sharedfs"
)

func TestConfigPathPrecedence(t *testing.T) {
	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: "/opt/c8s.toml"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(ConfigPathEnv, "/env/c8s.toml")
	if p, err := configPath(&taskAPI.CreateTaskRequest{Options: opts}); err != nil || p != "/opt/c8s.toml" {
		t.Fatalf("with runtime option: %q, %v", p, err)
	}
	if p, _ := configPath(&taskAPI.CreateTaskRequest{}); p != "/env/c8s.toml" {
		t.Fatalf("with env: %q", p)
	}
	t.Setenv(ConfigPathEnv, "")
	if p, _ := configPath(&taskAPI.CreateTaskRequest{}); p != DefaultConfigPath {
		t.Fatalf("default: %q", p)
	}
}

func TestLoadConfigErrorsNameTheProblem(t *testing.T) {
	if _, err := loadConfig("/nonexistent/c8s.toml"); err == nil || !strings.Contains(err.Error(), "/nonexistent/c8s.toml") || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("missing explicit config: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("[hypervisor]\nkernal = \"x\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig(bad); err == nil || !strings.Contains(err.Error(), "kernal") {
		t.Fatalf("typo in config: %v", err)
	}
}

func TestSharedFilesPassesSmallBindMountedFiles(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, maxSharedFile+1), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/etc/hosts", Type: "bind", Source: hosts, Options: []string{"rbind", "ro"}},
		{Destination: "/data", Type: "bind", Source: dir, Options: []string{"rbind"}},
		{Destination: "/big", Source: big, Options: []string{"bind"}},
		{Destination: "/proc", Type: "proc", Source: "proc"},
	}}
	files := sharedFiles(context.Background(), spec)
	if len(files) != 1 || files[0].Source != hosts || string(files[0].Content) != "127.0.0.1 localhost\n" || files[0].Mode != 0o644 {
		t.Fatalf("shared files = %+v, want only %s", files, hosts)
	}
}

func TestDiskIDIsAValidBoundedQEMUID(t *testing.T) {
	long := strings.Repeat("a1", 32)
	id := diskID(long)
	if len(id) > 31 || !strings.HasPrefix(id, "rootfs-") {
		t.Fatalf("diskID(%q) = %q", long, id)
	}
	if diskID("c1") != "rootfs-c1" {
		t.Fatalf("diskID(c1) = %q", diskID("c1"))
	}
}

func TestValidIDRejectsPaths(t *testing.T) {
	for _, id := range []string{"", ".", "..", "a/b", "../x"} {
		if err := validID(id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("validID(%q) = %v, want invalid argument", id, err)
		}
	}
	if err := validID("c8s-1"); err != nil {
		t.Fatal(err)
	}
}

// podDirs runs podFor for sandbox id in namespace ns with a config whose
// runtime.state_dir is root.
func podDirs(t *testing.T, root, ns, id string) *podState {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"qemu", "vmlinuz", "initrd.img"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "c8s.toml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "[hypervisor]\npath = %q\nkernel = %q\ninitrd = %q\n[runtime]\nstate_dir = %q\n",
		filepath.Join(dir, "qemu"), filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img"), root), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(ConfigPathEnv, cfg)
	spec := &specs.Spec{Annotations: map[string]string{SandboxIDAnnotation: id}}
	pod, err := (&service{}).podFor(context.Background(), ns, &taskAPI.CreateTaskRequest{ID: "c1"}, spec)
	if err != nil {
		t.Fatalf("podFor(%q, %q): %v", ns, id, err)
	}
	return pod
}

// sockPath finds the unix socket paths in QEMU arguments (not the TDX
// quote generation service's qgs.socket, which is the node's).
var sockPath = regexp.MustCompile(`/[^,:"]*\.sock\b`)

// TestPodSocketsFit: whatever the namespace (containerd allows 76 bytes)
// and the sandbox ID (CRI's are 64 hex digits), every unix socket the shim
// and QEMU make for the pod fits in 107 bytes below the longest
// runtime.state_dir the configuration accepts.
func TestPodSocketsFit(t *testing.T) {
	root := "/" + strings.Repeat("r", statedir.MaxRoot-1)
	ns, id := strings.Repeat("n", 76), strings.Repeat("0123456789abcdef", 4)
	pod := podDirs(t, root, ns, id)
	for _, teeName := range []string{"sim", "snp", "tdx"} {
		for _, vsock := range []uint32{0, 7} {
			h := pod.cfg.Hypervisor
			h.TEE, h.Firmware = teeName, "/usr/share/ovmf/OVMF.fd"
			backend, err := tee.Lookup(teeName)
			if err != nil {
				t.Fatal(err)
			}
			dirs := map[string]string{"pod": pod.stateDir, "incoming": statedir.Incoming(root, id)}
			for what, stateDir := range dirs {
				argv, err := vm.Args(vm.Spec{
					ID: id, StateDir: stateDir, Hypervisor: h, Accel: "kvm", VsockCID: vsock,
					SharedFS: &vm.SharedFS{Socket: filepath.Join(pod.fsDir, sharedfs.SocketName), Tag: sharedfs.Tag},
				}, backend)
				if err != nil {
					t.Fatalf("%s %s vsock %d: %v", teeName, what, vsock, err)
				}
				want := []string{"c8s.kbs.sock", "qmp.sock", "virtiofsd.sock"}
				if vsock == 0 {
					want = append(want, "agent.sock")
				}
				if teeName == "sim" {
					want = append(want, "c8s.attest.sock")
				}
				var names []string
				for _, p := range sockPath.FindAllString(strings.Join(argv, " "), -1) {
					names = append(names, filepath.Base(p))
					if !strings.HasPrefix(p, root+"/") || len(p) > statedir.UnixPathMax {
						t.Errorf("%s %s vsock %d: socket %s (%d bytes)", teeName, what, vsock, p, len(p))
					}
				}
				slices.Sort(want)
				slices.Sort(names)
				if !slices.Equal(names, want) {
					t.Errorf("%s %s vsock %d: sockets %q, want %q", teeName, what, vsock, names, want)
				}
			}
		}
	}
}

func TestPodDirs(t *testing.T) {
	// Short names are kept as they were.
	pod := podDirs(t, "/run/c8s", "default", "pod1")
	if pod.stateDir != "/run/c8s/default/pod1" || pod.diskDir != "/run/c8s/default/disks/pod1" || pod.fsDir != "/run/c8s/default/fs/pod1" {
		t.Fatalf("pod dirs: %s, %s, %s", pod.stateDir, pod.diskDir, pod.fsDir)
	}
	// Long namespaces that share a prefix, CRI IDs that share one.
	id := strings.Repeat("e7", 32)
	a := podDirs(t, "/run/c8s", strings.Repeat("n", 76), id)
	b := podDirs(t, "/run/c8s", strings.Repeat("n", 75)+"m", id)
	c := podDirs(t, "/run/c8s", strings.Repeat("n", 76), strings.Repeat("e7", 31)+"e8")
	if a.stateDir == b.stateDir || a.diskDir == b.diskDir || a.fsDir == b.fsDir || a.stateDir == c.stateDir || a.diskDir == c.diskDir || a.fsDir == c.fsDir {
		t.Fatalf("different pods share dirs: %+v, %+v, %+v", a, b, c)
	}
	if base := filepath.Base(a.stateDir); !strings.HasPrefix(base, "e7e7e7e7e7e7-") {
		t.Fatalf("a shortened ID keeps a prefix an admin can match: %s", base)
	}
	// `shim delete` finds the share from the state dir it recorded.
	if statedir.FSDir(a.stateDir) != a.fsDir {
		t.Fatalf("statedir.FSDir(%s) = %s, want %s", a.stateDir, statedir.FSDir(a.stateDir), a.fsDir)
	}
}

func TestPodRefusesLongStateDir(t *testing.T) {
	root := "/" + strings.Repeat("r", statedir.MaxRoot)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c8s.toml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "[runtime]\nstate_dir = %q\n", root), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(ConfigPathEnv, cfg)
	_, err := (&service{}).podFor(context.Background(), "default", &taskAPI.CreateTaskRequest{ID: "c1"}, &specs.Spec{})
	if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "runtime.state_dir") ||
		!strings.Contains(err.Error(), "longer than the 40") || !strings.Contains(err.Error(), "use a shorter directory") {
		t.Fatalf("podFor with a %d-byte state dir: %v", len(root), err)
	}
}

func TestPodInitData(t *testing.T) {
	doc := "version = \"0.1\"\n[agent_policy]\nallow_exec = false\n"
	cfg := config.Default()
	got, err := podInitData(map[string]string{"io.c8s.initdata": base64.StdEncoding.EncodeToString([]byte(doc))}, cfg)
	if err != nil || string(got) != doc {
		t.Fatalf("from the annotation: %q, %v", got, err)
	}
	if got, err := podInitData(nil, cfg); err != nil || len(got) != 0 {
		t.Fatalf("no init data: %q, %v", got, err)
	}
	def := filepath.Join(t.TempDir(), "initdata.toml")
	if err := os.WriteFile(def, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Attestation.InitData = def
	if got, err := podInitData(nil, cfg); err != nil || string(got) != doc {
		t.Fatalf("node default: %q, %v", got, err)
	}
	for name, ann := range map[string]string{
		"not base64":  "%%%",
		"unknown key": base64.StdEncoding.EncodeToString([]byte("version = \"0.1\"\nallow_everything = true\n")),
	} {
		if _, err := podInitData(map[string]string{"io.c8s.initdata": ann}, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A bundle names its shim by pid and start time: the shim that wrote it
// runs; another process under its pid (reused), or none, is not it.
func TestBundleStateNamesItsShim(t *testing.T) {
	bundle := t.TempDir()
	if err := writeBundleState(bundle, BundleState{Sandbox: "p"}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadBundleState(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if st.ShimPid != os.Getpid() || !st.ShimAlive() {
		t.Fatalf("the bundle of this shim: %+v, alive %v", st, st.ShimAlive())
	}
	reused := st
	reused.ShimStart++
	gone := st
	gone.ShimPid = 0
	if reused.ShimAlive() || gone.ShimAlive() {
		t.Fatalf("another process under the pid (%v) or none (%v) taken for the shim", reused.ShimAlive(), gone.ShimAlive())
	}
}
