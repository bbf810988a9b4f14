package accel

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/vm/testguest"
)

func TestChooseForced(t *testing.T) {
	for _, mode := range []string{KVM, TCG} {
		// No QEMU and no kernel are needed: nothing is probed.
		r, err := Choose(context.Background(), mode, "/nonexistent/qemu", "", t.TempDir())
		if err != nil || r.Accel != mode || !strings.Contains(r.Reason, "hypervisor.accel") {
			t.Fatalf("Choose(%s) = %+v, %v", mode, r, err)
		}
	}
	if _, err := Choose(context.Background(), "hvf", "", "", ""); err == nil || !strings.Contains(err.Error(), `"hvf"`) {
		t.Fatalf("Choose(hvf) error = %v", err)
	}
}

func TestChooseWithoutKVMDevice(t *testing.T) {
	old := KVMDevice
	KVMDevice = filepath.Join(t.TempDir(), "kvm")
	t.Cleanup(func() { KVMDevice = old })
	r, err := Choose(context.Background(), Auto, "/nonexistent/qemu", "", t.TempDir())
	if err != nil || r.Accel != TCG || !strings.Contains(r.Reason, KVMDevice+" is not available") {
		t.Fatalf("Choose(auto) without a KVM device = %+v, %v", r, err)
	}
}

// observation is what the test itself sees when it boots the kernel under
// KVM, independently of Probe.
type observation struct {
	banner  bool
	after   time.Duration
	exited  bool
	output  string
	timeout time.Duration
}

// observeKVM boots kernel under KVM for up to timeout (twice the probe
// budget) and reports whether the banner appeared on the serial console.
func observeKVM(t *testing.T, qemu, kernel string, timeout time.Duration) observation {
	t.Helper()
	cmd := exec.Command(qemu, "-nodefaults", "-display", "none", "-no-reboot", "-machine", "q35",
		"-accel", "kvm", "-cpu", "host", "-m", "256M", "-kernel", kernel,
		"-append", "console=ttyS0 earlyprintk=serial panic=-1", "-serial", "stdio")
	var out bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); pw.Close(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	seen := make(chan time.Duration, 1)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 4096)
		for {
			n, err := pr.Read(buf)
			out.Write(buf[:n])
			if bytes.Contains(out.Bytes(), []byte("Linux version")) {
				seen <- time.Since(start)
				io.Copy(io.Discard, pr)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	o := observation{timeout: timeout}
	select {
	case o.after = <-seen:
		o.banner = true
	case <-exited:
		o.exited = true
	case <-time.After(timeout):
	}
	_ = cmd.Process.Kill()
	<-exited
	<-readerDone // the pipe is closed once QEMU is reaped
	o.output = out.String()
	return o
}

// TestChooseAutoProbe runs the real KVM probe of this machine and checks
// the choice is consistent with what the test observes itself; on a host
// where KVM hangs that is TCG, because the probe timed out.
func TestChooseAutoProbe(t *testing.T) {
	if _, err := os.Stat(KVMDevice); err != nil {
		t.Skipf("%s is absent, so auto never probes here (covered by TestChooseWithoutKVMDevice)", KVMDevice)
	}
	qemu := testguest.QEMU(t)
	kernel := testguest.GetKernel(t).Path
	cache := t.TempDir()

	var logs bytes.Buffer
	log.L.Logger.SetOutput(&logs)
	t.Cleanup(func() { log.L.Logger.SetOutput(os.Stderr) })

	r, err := Choose(context.Background(), Auto, qemu, kernel, cache)
	if err != nil {
		t.Fatalf("Choose: %v", err)
	}
	t.Logf("Choose: %s (%s)", r.Accel, r.Reason)
	if r.Cached {
		t.Fatal("first Choose with an empty cache claims a cached result")
	}
	if pids := testguest.QEMUChildren(t); len(pids) != 0 {
		t.Fatalf("probe QEMU left running: %v", pids)
	}
	if lines := strings.Split(strings.TrimSpace(logs.String()), "\n"); len(lines) != 1 ||
		!strings.Contains(lines[0], "using "+strings.ToUpper(r.Accel)+": ") || !strings.Contains(lines[0], "accel="+r.Accel) {
		t.Fatalf("Choose must log one line with its choice; log:\n%s", logs.String())
	}

	o := observeKVM(t, qemu, kernel, 2*ProbeBudget)
	t.Logf("observed: banner=%v after %v, exited=%v", o.banner, o.after, o.exited)
	switch {
	case o.banner && o.after <= ProbeBudget:
		if r.Accel != KVM {
			t.Fatalf("KVM boots the kernel here (banner after %v) but Choose picked %s: %s", o.after, r.Accel, r.Reason)
		}
	case o.banner:
		t.Logf("KVM printed the banner only after %v, beyond the %v budget; either choice is consistent", o.after, ProbeBudget)
	case o.exited:
		if r.Accel != TCG || !strings.Contains(r.Reason, "probe QEMU failed") {
			t.Fatalf("QEMU cannot run under KVM here (output %q) but Choose = %+v", o.output, r)
		}
	default:
		if r.Accel != TCG || !strings.Contains(r.Reason, "timed out") {
			t.Fatalf("KVM printed nothing within %v here but Choose = %+v; want TCG because the probe timed out", o.timeout, r)
		}
	}

	again, err := Choose(context.Background(), Auto, qemu, kernel, cache)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Cached || again.Accel != r.Accel || again.Reason != r.Reason {
		t.Fatalf("second Choose = %+v, want the cached %+v", again, r)
	}
}

func TestProbeKillsQEMU(t *testing.T) {
	qemu := testguest.QEMU(t)
	// A kernel QEMU cannot load: QEMU exits by itself and Probe says so.
	bogus := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(bogus, []byte("not a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Probe(context.Background(), qemu, bogus, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p.Booted || !p.Exited || p.Output == "" {
		t.Fatalf("probe of a bogus kernel = %+v, want exited with output", p)
	}
	if _, err := Probe(context.Background(), qemu, filepath.Join(t.TempDir(), "missing"), time.Second); err == nil || !strings.Contains(err.Error(), "make image") {
		t.Fatalf("probe of a missing kernel: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	kernel := testguest.GetKernel(t).Path
	if _, err := Probe(ctx, qemu, kernel, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("probe with a cancelled context: %v", err)
	}
	if pids := testguest.QEMUChildren(t); len(pids) != 0 {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		t.Fatalf("probe QEMU left running: %v", pids)
	}
}

// TestCachedReadsTheProbeCache: Cached finds what a probe cached for the
// same QEMU binary and KVM device, and nothing for another binary.
func TestCachedReadsTheProbeCache(t *testing.T) {
	dir := t.TempDir()
	saved := KVMDevice
	KVMDevice = filepath.Join(dir, "kvm")
	t.Cleanup(func() { KVMDevice = saved })
	qemu, other := filepath.Join(dir, "qemu"), filepath.Join(dir, "qemu-other")
	for _, f := range []string{KVMDevice, qemu} {
		if err := os.WriteFile(f, []byte("x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(other, []byte("another build"), 0o755); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	if _, ok := Cached(qemu, cache); ok {
		t.Fatal("Cached found a result in an empty cache")
	}
	kvm, err := os.Stat(KVMDevice)
	if err != nil {
		t.Fatal(err)
	}
	key, err := cacheKey(qemu, kvm)
	if err != nil {
		t.Fatal(err)
	}
	want := Result{Accel: TCG, Reason: "probe timed out"}
	if err := writeCache(cachePath(cache, key), want); err != nil {
		t.Fatal(err)
	}
	got, ok := Cached(qemu, cache)
	if !ok || got.Accel != want.Accel || got.Reason != want.Reason || !got.Cached {
		t.Fatalf("Cached = %+v, %v; want %+v", got, ok, want)
	}
	if _, ok := Cached(other, cache); ok {
		t.Fatal("Cached returned another QEMU binary's verdict")
	}
}
