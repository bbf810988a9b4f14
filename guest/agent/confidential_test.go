package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/google/go-tdx-guest/testing/testdata"
)

// startedAsTEE makes the agent one of a guest started as tee (c8s.tee),
// before it serves any container, and unmounts the pod's emptyDir tmpfs
// at the end.
func (e *env) startedAsTEE(t *testing.T, tee string) {
	t.Helper()
	e.svc.cfg.TEE = tee
	t.Cleanup(func() { _ = unmountAll(e.svc.cfg.EmptyDirDir) })
}

// mountAt returns the mount on path p, or nil.
func mountAt(t *testing.T, p string) *mountinfo.Info {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(p))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 {
		return nil
	}
	return ms[len(ms)-1]
}

// loopBackingFile is the image file behind a loop device.
func loopBackingFile(t *testing.T, dev string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop/backing_file"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// In a guest started as a TEE a container writes to its root filesystem
// (here on a read-only disk, as a host's could be) and reads back what it
// wrote; the writes are in a tmpfs of the guest, sized by the container's
// memory limit, never on the disk, and go with the container.
func TestConfidentialWritesStayInGuestMemory(t *testing.T) {
	e := newEnv(t)
	e.startedAsTEE(t, teeparam.Sim)
	marker := fmt.Sprintf("c8s-marker-%d", time.Now().UnixNano())
	s := e.spec(t, "sh", "-c", "echo "+marker+" >/written && mkdir -p /var/data && echo "+marker+" >/var/data/file && cat /written /var/data/file && "+
		"cat /proc/self/mountinfo >&2; ls -ld / >&2")
	s.Root.Readonly = false
	limit := int64(48 << 20)
	s.Linux.Resources = &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}
	// The host asks for its disk read-write and with devices.
	e.create(t, "cw", s, pipes(), func(r *agentapi.CreateContainerRequest) { r.Rootfs.Options = []string{"rw", "dev"} })
	bundle := filepath.Join(e.stateDir, "cw")

	// nodev on the lower layer alone does not hold through the overlay.
	if m := mountAt(t, filepath.Join(bundle, "rootfs")); m == nil || m.FSType != "overlay" || !strings.Contains(","+m.Options+",", ",nodev,") {
		t.Fatalf("the container's root is %+v, want an overlay mounted nodev", m)
	}
	lower := mountAt(t, filepath.Join(bundle, lowerDir))
	if lower == nil || lower.FSType != "ext4" || !strings.Contains(","+lower.Options+",", ",ro,") || !strings.Contains(lower.Options, "nodev") {
		t.Fatalf("the disk is mounted %+v, want ext4 ro,nodev whatever the host asked", lower)
	}
	scratch := filepath.Join(bundle, scratchDir)
	var fs unix.Statfs_t
	if err := unix.Statfs(scratch, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC || int64(fs.Blocks)*fs.Bsize != limit {
		t.Errorf("the writable layer's filesystem: type %#x, %d bytes; want a tmpfs of the memory limit, %d bytes", fs.Type, int64(fs.Blocks)*fs.Bsize, limit)
	}

	e.start(t, "cw")
	if st := e.wait(t, "cw", ""); st != 0 {
		t.Fatalf("exit %d; stderr %s", st, e.readAll(t, "cw", "", true))
	}
	if out := e.readAll(t, "cw", "", false); out != marker+"\n"+marker+"\n" {
		t.Errorf("the container read back %q", out)
	}
	stderr := e.readAll(t, "cw", "", true)
	rootIsOverlay := false
	for _, l := range strings.Split(stderr, "\n") {
		if f := strings.Fields(l); len(f) > 8 && f[4] == "/" && strings.Contains(l, " - overlay ") {
			rootIsOverlay = true
		}
	}
	if !rootIsOverlay || !strings.Contains(stderr, "drwxr-xr-x") {
		t.Errorf("in the container, / is not an overlay with the image's mode:\n%s", stderr)
	}
	if b, err := os.ReadFile(filepath.Join(scratch, "upper", "written")); err != nil || string(b) != marker+"\n" {
		t.Errorf("the write in guest memory: %q, %v", b, err)
	}
	img, err := os.ReadFile(loopBackingFile(t, e.loopDev))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(img, []byte(marker)) {
		t.Error("the container's write reached its disk image")
	}
	e.remove(t, "cw")
	e.assertGone(t, "cw")
}

// A bind of a kubelet emptyDir becomes, in a guest started as a TEE, one
// directory of the pod's guest tmpfs: the pod's containers share it, it
// outlives them (the kubelet keeps an emptyDir for the pod's life), and
// what the host shares for that path is not used.
func TestEmptyDirInGuestMemory(t *testing.T) {
	e := newEnv(t)
	e.startedAsTEE(t, teeparam.Sim)
	share := t.TempDir()
	e.svc.cfg.SharedDir, e.svc.cfg.MountShared = share, func(string, string) error { return nil }
	if err := os.Mkdir(filepath.Join(share, "a-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(share, "a-0", "from-host"), []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const src = "/var/lib/kubelet/pods/0f1e/volumes/kubernetes.io~empty-dir/cache"
	run := e.runWithShare(t, specs.Mount{Destination: "/cache", Type: "bind", Source: src, Options: []string{"rbind", "rw"}}, "a-0")
	if out := run("a", "echo in-guest >/cache/x && ls -ld /cache"); !strings.HasPrefix(out, "drwxrwxrwx") {
		t.Errorf("the emptyDir in the container: %q, want mode 0777 as the kubelet makes it", out)
	}
	if out := run("b", "cat /cache/x; ls /cache"); out != "in-guest\nx\n" {
		t.Errorf("a second container of the pod reads %q from the emptyDir, want the first's write and no host file", out)
	}
	var fs unix.Statfs_t
	dir := filepath.Join(e.svc.cfg.EmptyDirDir, "0f1e", "cache")
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Errorf("the emptyDir %s: %v, filesystem %#x, want a guest tmpfs", dir, err, fs.Type)
	}
	if _, err := os.Stat(filepath.Join(share, "a-0", "x")); err == nil {
		t.Error("the write reached the host's share")
	}
}

// runWithShare returns a runner of containers of the pod with bind
// mounted, whose source the host also shares as share: each runs script
// to its end, is removed, and gives its stdout.
func (e *env) runWithShare(t *testing.T, bind specs.Mount, share string) func(id, script string) string {
	return func(id, script string) string {
		t.Helper()
		s := e.spec(t, "sh", "-c", script)
		s.Mounts = append(s.Mounts, bind)
		e.create(t, id, s, pipes(), func(r *agentapi.CreateContainerRequest) {
			r.SharedMounts = []*agentapi.SharedMount{{Source: bind.Source, Name: share}}
		})
		e.start(t, id)
		if st := e.wait(t, id, ""); st != 0 {
			t.Fatalf("%s: exit %d: %s", id, st, e.readAll(t, id, "", true))
		}
		out := e.readAll(t, id, "", false)
		e.remove(t, id)
		e.assertGone(t, id)
		return out
	}
}

// TestMaliciousHostPodShmInGuestMemory: containerd binds its shm directory
// of the sandbox (a tmpfs of the host's) on every container's /dev/shm,
// and the host shares it. In a guest started as a TEE the pod's /dev/shm
// is a directory of the guest's tmpfs instead: what the containers put in
// POSIX shared memory never reaches the host, and they share it.
func TestMaliciousHostPodShmInGuestMemory(t *testing.T) {
	e := newEnv(t)
	e.startedAsTEE(t, teeparam.Sim)
	share := t.TempDir()
	e.svc.cfg.SharedDir, e.svc.cfg.MountShared = share, func(string, string) error { return nil }
	if err := os.Mkdir(filepath.Join(share, "s-0"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(share, "s-0", "from-host"), []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const src = "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/0123/shm"
	run := e.runWithShare(t, specs.Mount{Destination: "/dev/shm", Type: "bind", Source: src, Options: []string{"rbind", "rw"}}, "s-0")
	if out := run("a", "echo secret >/dev/shm/seg && ls -ld /dev/shm"); !strings.HasPrefix(out, "drwxrwxrwt") {
		t.Errorf("the pod's /dev/shm: %q, want mode 1777", out)
	}
	if out := run("b", "cat /dev/shm/seg; ls /dev/shm"); out != "secret\nseg\n" {
		t.Errorf("a second container of the pod reads %q from /dev/shm, want the first's write and no host file", out)
	}
	var fs unix.Statfs_t
	dir := filepath.Join(e.svc.cfg.EmptyDirDir, ".pod", "shm")
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Errorf("the pod's /dev/shm %s: %v, filesystem %#x, want a guest tmpfs", dir, err, fs.Type)
	}
	if _, err := os.Stat(filepath.Join(share, "s-0", "seg")); err == nil {
		t.Error("the shared memory reached the host's share")
	}
}

// A host that swaps a share entry for a symlink after the agent checked
// it (virtiofsd serves the share; the host writes it at will) would have
// the runtime bind whatever guest path the link names, such as the pod's
// secrets. The agent stages each entry by file descriptor: the container
// gets what was checked.
func TestMaliciousHostSwapsShareEntry(t *testing.T) {
	e := newEnv(t)
	share, secrets := t.TempDir(), t.TempDir()
	e.svc.cfg.SharedDir, e.svc.cfg.MountShared = share, func(string, string) error { return nil }
	if err := os.WriteFile(filepath.Join(secrets, "db"), []byte("db-secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, file := filepath.Join(share, "c-0"), filepath.Join(share, "c-1")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "db"), []byte("host config\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("host file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	swapped := false
	testHookSharesStaged = func() {
		// After the check, before the runtime binds.
		for target, entry := range map[string]string{secrets: dir, filepath.Join(secrets, "db"): file} {
			if err := os.Rename(entry, entry+".old"); err != nil {
				t.Error(err)
			}
			if err := os.Symlink(target, entry); err != nil {
				t.Error(err)
			}
		}
		swapped = true
	}
	t.Cleanup(func() { testHookSharesStaged = nil })
	const cm, cmFile = "/var/lib/kubelet/pods/u/volumes/kubernetes.io~configmap/cfg", "/var/lib/kubelet/pods/u/etc-hosts-big"
	// Destinations the read-only test image has.
	s := e.spec(t, "sh", "-c", "cat /tmp/db /etc/c8s-file")
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: "/tmp", Type: "bind", Source: cm, Options: []string{"rbind", "ro"}},
		specs.Mount{Destination: "/etc/c8s-file", Type: "bind", Source: cmFile, Options: []string{"rbind", "ro"}},
	)
	e.create(t, "c", s, pipes(), func(r *agentapi.CreateContainerRequest) {
		r.SharedMounts = []*agentapi.SharedMount{{Source: cm, Name: "c-0"}, {Source: cmFile, Name: "c-1"}}
	})
	if !swapped {
		t.Fatal("the host never swapped the entries")
	}
	e.start(t, "c")
	if st := e.wait(t, "c", ""); st != 0 {
		t.Fatalf("exit %d: %s", st, e.readAll(t, "c", "", true))
	}
	if out := e.readAll(t, "c", "", false); out != "host config\nhost file\n" {
		t.Errorf("the container read %q through its shared mounts, want what the agent checked (not the secrets the swapped links name)", out)
	}
	e.remove(t, "c")
	e.assertGone(t, "c")
	// Removing the container unmounted the staged entries before removing
	// the bundle: the host's content is intact.
	for _, p := range []string{filepath.Join(dir+".old", "db"), file + ".old"} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("host content after remove: %v", err)
		}
	}
}

// A guest started as snp or tdx whose launch digest is zero (no init
// data measured) enforces the built-in default from the first request: the
// host runs the containers it chooses, but cannot exec, read their output,
// write their stdin, bind guest paths or virtio-fs shares, or
// port-forward; every denial says why. Empty init data, whose digest is
// zero, does not lift it.
func TestMaliciousHostZeroLaunchDigest(t *testing.T) {
	e := newEnv(t)
	e.startedAsTEE(t, teeparam.SNP)
	calls := 0
	e.svc.cfg.Evidence = snpEvidence([32]byte{}, &calls)
	share := t.TempDir()
	shareMounts := 0
	e.svc.cfg.SharedDir, e.svc.cfg.MountShared = share, func(string, string) error { shareMounts++; return nil }
	if err := os.Mkdir(filepath.Join(share, "c-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(e.svc.cfg.SecretsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	explained := func(what string, err error, rule string) {
		t.Helper()
		assertCode(t, err, codes.PermissionDenied)
		if err == nil || !strings.Contains(err.Error(), rule) || !strings.Contains(err.Error(), "launched without init data (its HOST_DATA is zero)") {
			t.Errorf("%s: %v, want a denial by %s that explains the default", what, err, rule)
		}
	}

	// Any container the host chooses: it runs, its output stays in the
	// guest.
	s := e.spec(t, "sh", "-c", "echo secret-output; echo secret-err >&2; read x; echo never-seen-$x")
	s.Root.Readonly = false
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: "/cache", Type: "bind", Source: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/cache", Options: []string{"rbind"}},
		specs.Mount{Destination: "/scratch", Type: "tmpfs", Source: "tmpfs"})
	e.create(t, "app", s, &agentapi.Stdio{Stdin: true, Stdout: true, Stderr: true}, nil)
	e.start(t, "app")
	_, err := e.io.ReadStdout(ctxT(t), &agentapi.ReadStreamRequest{ContainerId: "app", MaxBytes: 100})
	explained("ReadStdout", err, policyapi.ZeroLaunchName+".logs")
	_, err = e.io.ReadStderr(ctxT(t), &agentapi.ReadStreamRequest{ContainerId: "app", MaxBytes: 100})
	explained("ReadStderr", err, policyapi.ZeroLaunchName+".logs")
	_, err = e.io.WriteStdin(ctxT(t), &agentapi.WriteStdinRequest{ContainerId: "app", Data: []byte("in\n")})
	explained("WriteStdin", err, policyapi.ZeroLaunchName+".stdin")
	_, err = e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{ContainerId: "app", ExecId: "e1", Process: e.process("cat", "/written"), Stdio: pipes()})
	explained("ExecProcess", err, policyapi.ZeroLaunchName+".exec")
	_, err = e.svc.forward.ListenPorts(ctxT(t), &agentapi.ListenPortsRequest{})
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), policyapi.ZeroLaunchName) {
		t.Errorf("ListenPorts: %v, want refused by %s", err, policyapi.ZeroLaunchName)
	}
	if calls != 1 {
		t.Errorf("the launch digest was read %d times, want once", calls)
	}
	// The host's empty init data (digest zero: it matches) changes nothing.
	if _, err := e.agent.SetInitData(ctxT(t), &agentapi.SetInitDataRequest{}); err != nil {
		t.Fatalf("empty init data: %v", err)
	}
	_, err = e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{ContainerId: "app", ExecId: "e2", Process: e.process("true"), Stdio: pipes()})
	explained("ExecProcess after empty init data", err, policyapi.ZeroLaunchName+".exec")
	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "app", Signal: 9}); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	e.wait(t, "app", "")
	e.remove(t, "app")
	e.assertGone(t, "app")

	// Guest-internal binds and virtio-fs shares.
	for name, m := range map[string]struct {
		mount  specs.Mount
		shared bool
	}{
		"a bind of the pod's secrets": {specs.Mount{Destination: "/s", Type: "bind", Source: e.svc.cfg.SecretsDir, Options: []string{"rbind"}}, false},
		"a bind of /":                 {specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind"}}, false},
		"a virtio-fs share":           {specs.Mount{Destination: "/data", Type: "bind", Source: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~configmap/c", Options: []string{"rbind"}}, true},
	} {
		s := e.spec(t, "true")
		s.Mounts = append(s.Mounts, m.mount)
		_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, s), Rootfs: rootfsReq(), Stdio: pipes(),
			SharedMounts: func() []*agentapi.SharedMount {
				if m.shared {
					return []*agentapi.SharedMount{{Source: m.mount.Source, Name: "c-0"}}
				}
				return nil
			}()})
		explained(name, err, policyapi.ZeroLaunchName+".mounts")
		e.assertGone(t, "evil")
	}
	// The policy allows no share: the host's virtio-fs was never mounted.
	if shareMounts != 0 {
		t.Errorf("the virtio-fs share was mounted %d times under a policy that allows none", shareMounts)
	}
}

// TDX reads the zero MRCONFIGID from its TDREPORT; the sim TEE and a guest
// without c8s.tee keep the allow-all of a pod without init data.
func TestZeroLaunchDigestByTEE(t *testing.T) {
	ctx := context.Background()
	tdx := &Service{cfg: Config{TEE: teeparam.TDX, Evidence: tdxEvidence(testdata.RawQuote, make([]byte, 48))}, containers: map[string]*container{}}
	if err := tdx.requirePolicy(ctx, "create"); err != nil {
		t.Fatal(err)
	}
	if !tdx.evaluator().Governs() || !tdx.zeroLaunch {
		t.Fatal("a tdx guest with a zero MRCONFIGID has no policy in force")
	}
	tdx.containers["c"] = &container{id: "c", init: &process{done: make(chan struct{})}, execs: map[string]*process{}}
	if _, err := tdx.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "c", ExecId: "e", Process: []byte(`{"args":["sh"],"cwd":"/"}`)}); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "MRCONFIGID is zero") {
		t.Errorf("exec in a tdx guest launched without init data: %v", err)
	}
	for _, tee := range []string{teeparam.Sim, ""} {
		calls := 0
		svc := &Service{cfg: Config{TEE: tee, Evidence: snpEvidence([32]byte{}, &calls)}}
		if err := svc.requirePolicy(ctx, "create"); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{}); err != nil {
			t.Fatal(err)
		}
		if svc.evaluator().Governs() || svc.zeroLaunch {
			t.Errorf("c8s.tee=%q with a zero launch digest: a policy is in force, want allow-all", tee)
		}
	}
	// A measured launch is not the zero one: the host's own policy waits
	// for SetInitData.
	var hd [32]byte
	hd[0] = 1
	calls := 0
	snp := &Service{cfg: Config{TEE: teeparam.SNP, Evidence: snpEvidence(hd, &calls)}}
	if err := snp.requirePolicy(ctx, "create"); !errdefs.IsFailedPrecondition(err) || snp.zeroLaunch {
		t.Errorf("measured snp launch: %v, zero launch %v", err, snp.zeroLaunch)
	}
}

// The writable layer's size is the container's memory limit, or the
// configured default; a size from the kernel command line is a size, not
// more tmpfs options.
func TestScratchSize(t *testing.T) {
	limit := int64(96 << 20)
	withLimit := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}}
	if got := scratchSize(withLimit, DefaultScratchSize); got != "100663296" {
		t.Errorf("with a memory limit: %s", got)
	}
	noLimit := int64(-1)
	for _, s := range []*specs.Spec{nil, {}, {Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &noLimit}}}}} {
		if got := scratchSize(s, "256m"); got != "256m" {
			t.Errorf("without a memory limit: %s", got)
		}
	}
	for v, ok := range map[string]bool{"50%": true, "256m": true, "1G": true, "268435456": true, "": false, "0": false, "-1": false, "1x": false, "1g,nr_inodes=0": false, "50%,uid=0": false} {
		if ValidTmpfsSize(v) != ok {
			t.Errorf("ValidTmpfsSize(%q) = %v", v, !ok)
		}
	}
}
