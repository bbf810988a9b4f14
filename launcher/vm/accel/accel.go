// Package accel chooses the QEMU accelerator for pod VMs.
//
// hypervisor.accel = "kvm" or "tcg" is taken as given. With "auto", KVM is
// used only when /dev/kvm exists AND a short probe boot of the real guest
// kernel under KVM reaches the kernel banner ("Linux version") on the serial
// console; otherwise TCG. /dev/kvm alone is not trusted: some hosts (for
// example PVM-based nested KVM) expose it but never run a guest.
//
// The probe result is cached in a file keyed by the host kernel release, the
// QEMU binary and the KVM device, so only the first VM on a node pays for it.
package accel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/internal/child"
)

// Accelerators.
const (
	KVM  = "kvm"
	TCG  = "tcg"
	Auto = "auto"
)

// ProbeBudget is how long the probe boot may take to print the banner.
const ProbeBudget = 3 * time.Second

// Banner is what the probe waits for on the guest serial console.
const Banner = "Linux version"

// ProbeKernelParams are the probe's guest kernel parameters: print as early
// as possible, and never reboot.
const ProbeKernelParams = "console=ttyS0 earlyprintk=serial panic=-1"

// KVMDevice is the device whose presence allows KVM. A variable so tests
// can point it elsewhere.
var KVMDevice = "/dev/kvm"

// Result is the chosen accelerator and why.
type Result struct {
	// Accel is "kvm" or "tcg".
	Accel string `json:"accel"`
	// Reason explains the choice in one sentence.
	Reason string `json:"reason"`
	// Cached is true when the result came from an earlier probe.
	Cached bool `json:"-"`
}

// Choose resolves mode ("auto", "kvm" or "tcg") to "kvm" or "tcg", probing
// KVM for "auto" (see the package doc). cacheDir may be empty to disable the
// cache. It logs one line with the choice and the reason.
func Choose(ctx context.Context, mode, qemuPath, kernelPath, cacheDir string) (Result, error) {
	res, err := choose(ctx, mode, qemuPath, kernelPath, cacheDir)
	if err != nil {
		return res, err
	}
	log.G(ctx).WithField("accel", res.Accel).WithField("cached", res.Cached).Infof("using %s: %s", strings.ToUpper(res.Accel), res.Reason)
	return res, nil
}

func choose(ctx context.Context, mode, qemuPath, kernelPath, cacheDir string) (Result, error) {
	switch mode {
	case KVM, TCG:
		return Result{Accel: mode, Reason: fmt.Sprintf("hypervisor.accel is %q", mode)}, nil
	case Auto, "":
	default:
		return Result{}, fmt.Errorf("accel: unknown accelerator %q: use auto, kvm or tcg", mode)
	}
	kvm, err := os.Stat(KVMDevice)
	if err != nil {
		return Result{Accel: TCG, Reason: fmt.Sprintf("%s is not available (%v)", KVMDevice, errors.Unwrap(err))}, nil
	}
	if kernelPath == "" {
		return Result{}, errors.New("accel: probing KVM needs the guest kernel: set hypervisor.kernel (run `make image`) or set hypervisor.accel")
	}
	key, err := cacheKey(qemuPath, kvm)
	if err != nil {
		return Result{}, err
	}
	cacheFile := ""
	if cacheDir != "" {
		cacheFile = cachePath(cacheDir, key)
		if r, ok := readCache(cacheFile); ok {
			return r, nil
		}
	}
	p, err := Probe(ctx, qemuPath, kernelPath, ProbeBudget)
	if err != nil {
		return Result{}, err
	}
	var res Result
	switch {
	case p.Booted:
		res = Result{Accel: KVM, Reason: fmt.Sprintf("%s is present and a probe boot under KVM printed %q after %v", KVMDevice, Banner, p.Elapsed.Round(time.Millisecond))}
	case p.Exited:
		res = Result{Accel: TCG, Reason: fmt.Sprintf("%s is present but the KVM probe QEMU failed: %s", KVMDevice, p.describeOutput())}
	default:
		res = Result{Accel: TCG, Reason: fmt.Sprintf("%s is present but the KVM probe boot timed out: no %q on the serial console within %v (KVM does not run guests on this host)", KVMDevice, Banner, p.Budget)}
	}
	if cacheFile != "" {
		if err := writeCache(cacheFile, res); err != nil {
			log.G(ctx).WithError(err).Warn("accel: could not cache the KVM probe result")
		}
	}
	return res, nil
}

// ProbeResult is what one probe boot observed.
type ProbeResult struct {
	// Booted is true when the banner appeared within the budget.
	Booted bool
	// Exited is true when QEMU exited on its own before that.
	Exited bool
	// Elapsed is the time until the banner, exit, or the budget ran out.
	Elapsed time.Duration
	// Budget is the budget the probe had.
	Budget time.Duration
	// Output is the tail of QEMU's serial console and stderr.
	Output string
}

func (p ProbeResult) describeOutput() string {
	out := strings.TrimSpace(p.Output)
	if out == "" {
		return "no output"
	}
	return out
}

// Probe boots kernelPath under KVM with ProbeKernelParams and no initrd,
// and waits up to budget for Banner on the serial console. The probe QEMU
// is always killed and reaped before Probe returns. An error means the
// probe could not run at all (or ctx ended).
func Probe(ctx context.Context, qemuPath, kernelPath string, budget time.Duration) (ProbeResult, error) {
	res := ProbeResult{Budget: budget}
	if _, err := os.Stat(kernelPath); err != nil {
		return res, fmt.Errorf("accel: probe kernel: %w (run `make image` or set hypervisor.kernel)", err)
	}
	cmd := exec.Command(qemuPath,
		"-name", "c8s-accel-probe",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-machine", "q35", "-accel", "kvm", "-cpu", "host", "-m", "256M", "-smp", "1",
		"-kernel", kernelPath, "-append", ProbeKernelParams,
		"-serial", "stdio",
	)
	pr, pw, err := os.Pipe()
	if err != nil {
		return res, err
	}
	cmd.Stdout = pw
	cmd.Stderr = pw
	start := time.Now()
	// Under a KVM that hangs its guests, the probe spins in the kernel
	// until killed: it must die with a shim killed meanwhile.
	exited := make(chan struct{})
	if err := child.Start(cmd, true, func() { _ = cmd.Wait(); close(exited) }); err != nil {
		pr.Close()
		pw.Close()
		return res, fmt.Errorf("accel: starting %s: %w", qemuPath, err)
	}
	pw.Close()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		pr.Close()
	}()

	found := make(chan struct{})
	var out tail
	go func() {
		if scanFor(io.TeeReader(pr, &out), Banner) {
			close(found)
		}
	}()
	timer := time.NewTimer(budget)
	defer timer.Stop()
	select {
	case <-found:
		res.Booted = true
	case <-exited:
		// QEMU may have printed the banner just before exiting.
		select {
		case <-found:
			res.Booted = true
		case <-time.After(100 * time.Millisecond):
			res.Exited = true
		}
	case <-timer.C:
	case <-ctx.Done():
		return res, fmt.Errorf("accel: KVM probe: %w", ctx.Err())
	}
	res.Elapsed = time.Since(start)
	res.Output = out.String()
	return res, nil
}

// scanFor reads r until it contains needle (true) or ends (false).
func scanFor(r io.Reader, needle string) bool {
	br := bufio.NewReader(r)
	var window []byte
	buf := make([]byte, 4096)
	for {
		n, err := br.Read(buf)
		window = append(window, buf[:n]...)
		if bytes.Contains(window, []byte(needle)) {
			return true
		}
		if len(window) > len(needle) {
			window = window[len(window)-len(needle):]
		}
		if err != nil {
			return false
		}
	}
}

// tail keeps the last 2 KiB written to it.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - 2048; over > 0 {
		t.b = t.b[over:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// cacheKey identifies the host kernel, the QEMU binary and the KVM device.
func cacheKey(qemuPath string, kvm os.FileInfo) (string, error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "", fmt.Errorf("accel: uname: %w", err)
	}
	qemu, err := os.Stat(qemuPath)
	if err != nil {
		return "", fmt.Errorf("accel: QEMU binary: %w (install qemu-system-x86 or set hypervisor.path)", err)
	}
	abs, _ := filepath.Abs(qemuPath)
	var rdev uint64
	if st, ok := kvm.Sys().(*syscall.Stat_t); ok {
		rdev = st.Rdev
	}
	h := sha256.New()
	fmt.Fprintf(h, "kernel=%s\nqemu=%s size=%d mtime=%d\nkvm=%s rdev=%d\n",
		unix.ByteSliceToString(uts.Release[:]), abs, qemu.Size(), qemu.ModTime().UnixNano(), KVMDevice, rdev)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func cachePath(cacheDir, key string) string {
	return filepath.Join(cacheDir, "accel-"+key+".json")
}

// Cached returns the verdict an earlier "auto" probe on this host (same
// kernel release, QEMU binary and KVM device) left in cacheDir, without
// probing.
func Cached(qemuPath, cacheDir string) (Result, bool) {
	kvm, err := os.Stat(KVMDevice)
	if err != nil || cacheDir == "" {
		return Result{}, false
	}
	key, err := cacheKey(qemuPath, kvm)
	if err != nil {
		return Result{}, false
	}
	return readCache(cachePath(cacheDir, key))
}

func readCache(path string) (Result, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Result{}, false
	}
	var r Result
	if json.Unmarshal(b, &r) != nil || (r.Accel != KVM && r.Accel != TCG) || r.Reason == "" {
		return Result{}, false
	}
	r.Cached = true
	return r, true
}

func writeCache(path string, r Result) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".accel-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// TCGTBSizeMiB is the TCG translation buffer c8s gives each pod VM's QEMU,
// in MiB. QEMU's default on x86 is 1 GiB of address space, and every page
// of it that translated code fills stays resident, so a busy guest's
// buffer could grow to 1 GiB per pod; a cap bounds that. When the buffer
// fills, QEMU flushes it and retranslates everything the guest runs next.
// A sim pod VM generates about 72 MiB of code by the time its agent
// serves (QEMU's `info jit`: 72.2-72.6 MiB, 0 flushes): 64 MiB flushed once
// during every boot and generated ~13.6 MiB more code again (about 43k
// translation blocks; at the 7-9 us each measured during migration, an
// estimated ~0.3 s of the vCPU thread); 128 MiB
// leaves room for the container's create and start. The price is up to 64
// MiB more resident per pod for guests that run that much distinct code
// (issue 18). SNP and TDX pods run under KVM and have no such buffer.
const TCGTBSizeMiB = 128

// Option is QEMU's -accel value for accel ("kvm" or "tcg"): TCG gets the
// translation buffer size TCGTBSizeMiB.
func Option(accel string) string {
	if accel == TCG {
		return fmt.Sprintf("%s,tb-size=%d", TCG, TCGTBSizeMiB)
	}
	return accel
}
