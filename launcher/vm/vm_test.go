package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm/testguest"
)

// guestInit is the test guest's /init: it loads the SCSI modules, names the
// virtio-serial ports like udev would, prints a marker on ttyS0 and serves a
// shell on the agent port (each host connection gets its own shell).
const guestInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in scsi_common scsi_mod sd_mod virtio_scsi; do
	ko=/lib/modules/$m.ko
	[ -e $ko ] || { xzcat $ko.xz > /tmp/$m.ko; ko=/tmp/$m.ko; }
	insmod $ko || echo "C8S-INSMOD-FAILED $m"
done
mkdir -p /dev/virtio-ports
for p in /sys/class/virtio-ports/*; do
	ln -s ../$(basename $p) /dev/virtio-ports/$(cat $p/name)
done
echo C8S-GUEST-READY
exec 3<>/dev/virtio-ports/c8s.agent
while true; do sh <&3 >&3 2>&3; sleep 0.1; done
`

const (
	guestReady = "C8S-GUEST-READY"
	coldMarker = "C8S-COLD-DISK-MARKER"
	hotMarker  = "C8S-HOT-DISK-MARKER"
	// guestWait bounds every wait for the guest; TCG on a busy CI machine
	// is slow, and a hang must still end the test.
	guestWait = 2 * time.Minute
)

// TestMain makes the VMs use the virtio-serial agent port, which the test
// guest serves, even on hosts with vhost-vsock.
func TestMain(m *testing.M) {
	vhostVsockDevice = "/nonexistent/vhost-vsock"
	os.Exit(m.Run())
}

type testEnv struct {
	qemu    string
	kernel  testguest.Kernel
	initrd  string
	workDir string
}

func newTestEnv(t testing.TB) testEnv {
	t.Helper()
	qemu := testguest.QEMU(t)
	k := testguest.GetKernel(t)
	files := map[string]string{}
	for _, path := range k.Modules {
		files["lib/modules/"+filepath.Base(path)] = path // name.ko or name.ko.xz
	}
	return testEnv{
		qemu:    qemu,
		kernel:  k,
		initrd:  testguest.Initramfs(t, guestInit, files),
		workDir: t.TempDir(),
	}
}

func (e testEnv) spec(id string, disks ...Disk) Spec {
	h := config.Default().Hypervisor
	h.Path = e.qemu
	h.Kernel = e.kernel.Path
	h.Initrd = e.initrd
	h.DefaultMemoryMiB = 256
	return Spec{ID: id, StateDir: filepath.Join(e.workDir, id), Hypervisor: h, Accel: "tcg", Disks: disks}
}

// diskFile creates a 1 MiB disk image starting with marker.
func (e testEnv) diskFile(t *testing.T, name, marker string) string {
	t.Helper()
	p := filepath.Join(e.workDir, name+".img")
	b := make([]byte, 1<<20)
	copy(b, marker+"\n")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// agentShell is a connection to the guest's test shell.
type agentShell struct {
	conn net.Conn
	r    *bufio.Reader
	n    int
}

// run runs a shell command in the guest and returns its output.
func (s *agentShell) run(t testing.TB, cmd string) string {
	t.Helper()
	s.n++
	end := fmt.Sprintf("C8S-END-%d", s.n)
	if err := s.conn.SetDeadline(time.Now().Add(guestWait)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(s.conn, "{ %s ; } </dev/null; echo %s\n", cmd, end); err != nil {
		t.Fatalf("writing to the agent channel: %v", err)
	}
	var out strings.Builder
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading from the agent channel after %q: %v (got %q)", cmd, err, out.String())
		}
		if strings.TrimSpace(line) == end {
			return out.String()
		}
		out.WriteString(line)
	}
}

// diskMarker polls the guest until a disk shows up at addr and returns
// its first line.
func diskMarker(t *testing.T, sh *agentShell, addr DiskAddress) string {
	t.Helper()
	script := fmt.Sprintf(`i=0; while [ $i -lt 600 ]; do for b in /sys/bus/scsi/devices/*:0:%d:%d/block/*; do [ -e "$b" ] && head -n1 /dev/$(basename $b) && exit 0; done; sleep 0.2; i=$((i+1)); done; echo NO-DISK`, addr.Target, addr.LUN)
	return strings.TrimSpace(sh.run(t, "( "+script+" )"))
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(guestWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// TestVM boots one guest under TCG and exercises the agent channel, cold
// and hot-plugged disks and Stop on it.
func TestVM(t *testing.T) {
	env := newTestEnv(t)
	ctx := context.Background()
	cold := env.diskFile(t, "cold", coldMarker)
	hot := env.diskFile(t, "hot", hotMarker)

	spec := env.spec("vm1", Disk{ID: "cold", Path: cold, ReadOnly: true})
	spec.Namespace = "ns1"
	v, err := Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = v.Stop(context.Background()) })

	var st struct {
		Status string `json:"status"`
	}
	if err := v.QMP().Execute(ctx, "query-status", nil, &st); err != nil {
		t.Fatalf("query-status: %v", err)
	}
	if st.Status != "running" {
		t.Fatalf("query-status = %v, want running", st.Status)
	}
	if fi, err := os.Stat(spec.StateDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state dir: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	if ix, err := statedir.ReadIndex(spec.StateDir); err != nil || ix != (statedir.Index{Namespace: "ns1", ID: "vm1"}) {
		t.Fatalf("the state dir's index: %+v, %v", ix, err)
	}

	t.Run("console", func(t *testing.T) {
		waitFor(t, "the guest's marker in console.log", func() bool {
			b, _ := os.ReadFile(v.ConsolePath())
			return strings.Contains(string(b), guestReady)
		})
		b, _ := os.ReadFile(v.ConsolePath())
		if strings.Contains(string(b), "C8S-INSMOD-FAILED") {
			t.Fatalf("guest could not load a SCSI module:\n%s", b)
		}
	})

	conn, err := v.DialAgent(ctx)
	if err != nil {
		t.Fatalf("DialAgent: %v", err)
	}
	defer conn.Close()
	sh := &agentShell{conn: conn, r: bufio.NewReader(conn)}

	t.Run("agent", func(t *testing.T) {
		if got := v.AgentTransport(); got != TransportVirtioSerial {
			t.Fatalf("AgentTransport = %q without vhost-vsock", got)
		}
		got := sh.run(t, "echo hello from $(uname -r)")
		if !strings.HasPrefix(got, "hello from 6.12") {
			t.Fatalf("guest said %q, want hello from the 6.12 test kernel", got)
		}
	})

	t.Run("cold-disk", func(t *testing.T) {
		addr, ok := v.DiskAddress("cold")
		if !ok || addr != (DiskAddress{Target: 0, LUN: 0}) {
			t.Fatalf("DiskAddress(cold) = %v, %v; want {0 0}, true", addr, ok)
		}
		if got := diskMarker(t, sh, addr); got != coldMarker {
			t.Fatalf("guest read %q from the cold-plugged disk, want %q", got, coldMarker)
		}
		if got := strings.TrimSpace(sh.run(t, "cat /sys/bus/scsi/devices/*:0:0:0/block/*/ro")); got != "1" {
			t.Fatalf("cold disk ro = %q, want 1 (read-only)", got)
		}
	})

	t.Run("hotplug", func(t *testing.T) {
		addr, err := v.AddDisk(ctx, Disk{ID: "hot", Path: hot})
		if err != nil {
			t.Fatalf("AddDisk: %v", err)
		}
		if addr != (DiskAddress{Target: 1}) {
			t.Fatalf("AddDisk address = %v, want the first free target {1 0}", addr)
		}
		if got, ok := v.DiskAddress("hot"); !ok || got != addr {
			t.Fatalf("DiskAddress(hot) = %v, %v", got, ok)
		}
		if got := diskMarker(t, sh, addr); got != hotMarker {
			t.Fatalf("guest read %q from the hotplugged disk, want %q", got, hotMarker)
		}
		if _, err := v.AddDisk(ctx, Disk{ID: "hot", Path: hot}); err == nil {
			t.Fatal("AddDisk with a duplicate ID succeeded")
		}
		if _, err := v.AddDisk(ctx, Disk{ID: "missing", Path: filepath.Join(env.workDir, "nope.img")}); err == nil || !strings.Contains(err.Error(), "nope.img") {
			t.Fatalf("AddDisk of a missing file: err = %v, want one naming the file", err)
		}
		if err := v.RemoveDisk(ctx, "hot"); err != nil {
			t.Fatalf("RemoveDisk: %v", err)
		}
		if _, ok := v.DiskAddress("hot"); ok {
			t.Fatal("DiskAddress still knows the removed disk")
		}
		gone := strings.TrimSpace(sh.run(t, `i=0; while [ -e /sys/bus/scsi/devices/0:0:1:0 ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done; ls /sys/bus/scsi/devices/ | grep -c ':0:1:0' || true`))
		if gone != "0" {
			t.Fatalf("the guest still sees the removed disk (%s)", gone)
		}
		if err := v.RemoveDisk(ctx, "hot"); err == nil {
			t.Fatal("RemoveDisk of a removed disk succeeded")
		}
		// The target is free again.
		addr, err = v.AddDisk(ctx, Disk{ID: "hot2", Path: hot, ReadOnly: true})
		if err != nil || addr.Target != 1 {
			t.Fatalf("AddDisk after removal = %v, %v; want target 1 reused", addr, err)
		}
		if got := diskMarker(t, sh, addr); got != hotMarker {
			t.Fatalf("guest read %q from the re-plugged disk, want %q", got, hotMarker)
		}
	})

	t.Run("stop", func(t *testing.T) {
		pid := v.Pid()
		if err := v.Stop(ctx); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		select {
		case <-v.Done():
		default:
			t.Fatal("Done is not closed after Stop")
		}
		if err := v.Err(); err != nil {
			t.Fatalf("Err after a clean Stop = %v, want nil", err)
		}
		if !processGone(pid) {
			t.Fatalf("qemu pid %d still exists after Stop", pid)
		}
		if _, err := os.Stat(spec.StateDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("state dir after Stop: %v, want it removed", err)
		}
		if err := v.Stop(ctx); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
		if _, err := v.DialAgent(ctx); err == nil {
			t.Fatal("DialAgent after Stop succeeded")
		}
	})
}

// TestVMKilledFromOutside checks that a QEMU that dies on its own closes
// Done, and Err says why. It does not wait for the guest to boot.
func TestVMKilledFromOutside(t *testing.T) {
	env := newTestEnv(t)
	ctx := context.Background()
	spec := env.spec("vm2")
	v, err := Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = v.Stop(context.Background()) })

	if err := syscall.Kill(v.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-v.Done():
	case <-time.After(guestWait):
		t.Fatal("Done not closed after qemu was killed")
	}
	err = v.Err()
	t.Logf("Err: %v", err)
	if err == nil || !strings.Contains(err.Error(), "killed by signal killed") || !strings.Contains(err.Error(), fmt.Sprint(v.Pid())) {
		t.Fatalf("Err = %v, want it to say qemu (with its pid) was killed", err)
	}
	if ee, ok := errors.AsType[*ExitError](err); !ok || ee.Pid != v.Pid() {
		t.Fatalf("Err = %#v, want an *ExitError for pid %d", err, v.Pid())
	}
	if err := v.Stop(ctx); err != nil {
		t.Fatalf("Stop after qemu died: %v", err)
	}
	if _, err := os.Stat(spec.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state dir after Stop: %v, want it removed", err)
	}
	if err := v.Err(); err == nil {
		t.Fatal("Err was cleared by Stop; it must keep explaining the crash")
	}
}

// TestStartFailures checks that failing starts explain themselves and leave
// nothing behind.
func TestStartFailures(t *testing.T) {
	env := newTestEnv(t)
	ctx := context.Background()

	t.Run("qemu-rejects-args", func(t *testing.T) {
		spec := env.spec("bad", Disk{ID: "d", Path: filepath.Join(env.workDir, "does-not-exist.img")})
		_, err := Start(ctx, spec)
		if err == nil {
			t.Fatal("Start with a missing disk image succeeded")
		}
		t.Logf("Start error: %v", err)
		// QEMU's own complaint, from its stderr, must be in the error.
		if !strings.Contains(err.Error(), "does-not-exist.img") || !strings.Contains(err.Error(), "exited with status 1") {
			t.Fatalf("error does not carry QEMU's exit and stderr: %v", err)
		}
		if _, err := os.Stat(spec.StateDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("state dir left behind: %v", err)
		}
		if pids := testguest.QEMUChildren(t); len(pids) != 0 {
			t.Fatalf("qemu processes left behind: %v", pids)
		}
	})

	t.Run("missing-kernel", func(t *testing.T) {
		spec := env.spec("nokernel")
		spec.Hypervisor.Kernel = filepath.Join(env.workDir, "no-vmlinuz")
		_, err := Start(ctx, spec)
		if err == nil || !strings.Contains(err.Error(), "no-vmlinuz") || !strings.Contains(err.Error(), "make image") {
			t.Fatalf("Start with a missing kernel: err = %v, want one naming the file and the fix", err)
		}
		if _, err := os.Stat(spec.StateDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("state dir left behind: %v", err)
		}
	})

	t.Run("igvm-needs-newer-qemu", func(t *testing.T) {
		spec := env.spec("igvm")
		spec.Hypervisor.TEE, spec.Accel = "snp", "kvm"
		spec.Hypervisor.SNP.CBitPos, spec.Hypervisor.SNP.ReducedPhysBits = 51, 1
		spec.Hypervisor.IGVM = filepath.Join(env.workDir, "snp.igvm")
		f, err := ProbeQEMU(ctx, spec.Hypervisor.Path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Start(ctx, spec)
		if f.Objects["igvm-cfg"] && f.Objects["sev-snp-guest"] {
			t.Logf("this QEMU %s has igvm-cfg; Start: %v", f.Version, err)
			return
		}
		want := fmt.Sprintf("QEMU %s (%s) has ", f.Version, spec.Hypervisor.Path)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "no igvm-cfg; need ≥ 10.1") {
			t.Fatalf("Start of an IGVM launch on QEMU %s: err = %v, want %q and \"no igvm-cfg; need ≥ 10.1\"", f.Version, err, want)
		}
		t.Logf("Start: %v", err)
		if _, err := os.Stat(spec.StateDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("state dir left behind: %v", err)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		spec := env.spec("cancelled")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := Start(cctx, spec)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Start with a cancelled context: err = %v, want context.Canceled", err)
		}
		if _, err := os.Stat(spec.StateDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("state dir left behind: %v", err)
		}
		if pids := testguest.QEMUChildren(t); len(pids) != 0 {
			t.Fatalf("qemu processes left behind: %v", pids)
		}
	})

	t.Run("state-dir-exists", func(t *testing.T) {
		spec := env.spec("exists")
		if err := os.Mkdir(spec.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		_, err := Start(ctx, spec)
		if err == nil || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("Start over an existing state dir: err = %v", err)
		}
		if _, err := os.Stat(spec.StateDir); err != nil {
			t.Fatalf("Start removed a state dir it did not create: %v", err)
		}
	})
}

// TestStopUnresponsive checks that Stop kills a QEMU that does not answer
// QMP quit (here: stopped with SIGSTOP) once the grace period or the
// caller's context runs out, and that this counts as a clean stop.
func TestStopUnresponsive(t *testing.T) {
	env := newTestEnv(t)
	spec := env.spec("vm3")
	v, err := Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = v.Stop(context.Background()) })
	pid := v.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := v.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !processGone(pid) {
		t.Fatalf("qemu pid %d survived Stop", pid)
	}
	if err := v.Err(); err != nil {
		t.Fatalf("Err after Stop had to kill qemu = %v, want nil", err)
	}
	if _, err := os.Stat(spec.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state dir after Stop: %v, want it removed", err)
	}
}
