package images

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/internal/newc"
	"github.com/c8s-dev/c8s/manifest"
)

// Environment variables that steer the image tests.
const (
	envImageDir = "C8S_IMAGE_DIR" // built image (default _output/image)
	// envRequired "1" (make test) fails the tests that need the built image
	// when it is absent; otherwise (make unit) they skip, as the end-to-end
	// tests do.
	envRequired = "C8S_E2E_REQUIRED"
)

// imageDir returns the built image directory; without one it skips with the
// hint to build it, or fails under envRequired=1.
func imageDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(envImageDir)
	if dir == "" {
		dir = filepath.Join("..", "_output", "image")
	}
	if _, err := os.Stat(filepath.Join(dir, manifest.FileName)); err != nil {
		if os.Getenv(envRequired) == "1" {
			t.Fatalf("no guest image in %s: %v; run make image (%s=1)", dir, err, envRequired)
		}
		t.Skipf("no guest image in %s: run make image", dir)
	}
	return dir
}

func TestBuiltImageMatchesManifest(t *testing.T) {
	dir := imageDir(t)
	m, err := manifest.Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Kernel.Release == "" || !strings.Contains(m.Kernel.Package, m.Kernel.Release) {
		t.Errorf("kernel release %q does not match package %q", m.Kernel.Release, m.Kernel.Package)
	}
}

// bootPortName is the virtio-serial port the test VM exposes.
const bootPortName = "org.c8s.boottest"

var moduleLine = regexp.MustCompile(`^C8S-TESTINIT MODULE (\S+) (loaded|exists|nodev)$`)

// TestBootImage boots the kernel with a copy of the initramfs whose /init is
// replaced by images/internal/testinit, and checks what that init reports:
// every listed module loads (ENODEV only for the platform-specific
// confidential-computing guest drivers), the virtio-serial port appears, and
// runc from the initramfs runs.
func TestBootImage(t *testing.T) {
	kernel, testInitrd, modules := prepareBoot(t)
	r := bootTestInit(t, kernel, testInitrd)
	t.Logf("boot to power-off took %v wall (TCG)", r.wall.Round(time.Millisecond))
	checkReport(t, r.lines, modules, r.console)
}

// BenchmarkBootImage measures a TCG boot of the image kernel and initramfs
// (with the test init) up to power-off, QEMU start included.
func BenchmarkBootImage(b *testing.B) {
	kernel, testInitrd, _ := prepareBoot(b)
	var total time.Duration
	n := 0
	for b.Loop() {
		r := bootTestInit(b, kernel, testInitrd)
		if !slices.Contains(r.lines, "C8S-TESTINIT OK") {
			b.Fatalf("test init did not report success; console:\n%s", r.console)
		}
		total += r.wall
		n++
	}
	b.ReportMetric(total.Seconds()/float64(n), "s/boot")
}

// prepareBoot verifies the built image and returns its kernel, the test
// initramfs and the image's module list.
func prepareBoot(tb testing.TB) (kernel, testInitrd string, modules []string) {
	tb.Helper()
	dir := imageDir(tb)
	m, err := manifest.Verify(dir)
	if err != nil {
		tb.Fatal(err)
	}
	kernel, _ = m.Path(dir, manifest.RoleKernel)
	// The unsealed initramfs has the whole root tree (a sealed image's
	// initrd.img has the first stage and what runs from memory, not the
	// root's other files).
	role := manifest.RoleInitrd
	if _, ok := m.Artifacts[manifest.RoleInitrdPlain]; ok {
		role = manifest.RoleInitrdPlain
	}
	initrd, _ := m.Path(dir, role)
	testInitrd, modules = buildTestInitrd(tb, initrd)
	return kernel, testInitrd, modules
}

type bootResult struct {
	lines   []string // the C8S-TESTINIT lines, in order
	console string   // everything QEMU printed
	wall    time.Duration
}

// bootTestInit boots kernel and initrd under TCG until the guest powers off.
// QEMU is killed in Cleanup if it is still running.
func bootTestInit(tb testing.TB, kernel, initrd string) bootResult {
	return bootQEMU(tb, "-kernel", kernel, "-initrd", initrd, "-append", "console=ttyS0 panic=-1 no_timer_check", // as launcher/vm.BaseKernelParams
		"-device", "virtio-serial",
		"-chardev", "null,id=boottest",
		"-device", "virtserialport,chardev=boottest,name="+bootPortName,
		"-device", "virtio-scsi-pci")
}

// bootQEMU boots a TCG VM with args until the guest powers off.
func bootQEMU(tb testing.TB, args ...string) bootResult {
	tb.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		tb.Fatalf("qemu-system-x86_64 not found: run make deps")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	tb.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, qemu, append([]string{
		"-accel", "tcg", "-machine", "q35", "-m", "512", "-smp", "1",
		"-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
	}, args...)...)
	var console, stderr bytes.Buffer
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start qemu: %v", err)
	}
	tb.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	var r bootResult
	sc := bufio.NewScanner(io.TeeReader(stdout, &console))
	for sc.Scan() {
		if line := strings.TrimRight(sc.Text(), "\r"); strings.HasPrefix(line, "C8S-TESTINIT") {
			r.lines = append(r.lines, line)
		}
	}
	waitErr := cmd.Wait()
	r.wall = time.Since(start)
	r.console = console.String() + stderr.String()
	if ctx.Err() != nil {
		tb.Fatalf("qemu did not power off within the limit; console:\n%s", r.console)
	}
	if waitErr != nil {
		tb.Fatalf("qemu: %v; console:\n%s", waitErr, r.console)
	}
	return r
}

func checkReport(t testing.TB, lines, modules []string, console string) {
	t.Helper()
	ok := false
	status := map[string]string{}
	var ports []string
	for _, l := range lines {
		switch {
		case l == "C8S-TESTINIT OK":
			ok = true
		case strings.HasPrefix(l, "C8S-TESTINIT FAIL"):
			t.Errorf("test init: %s", l)
		case strings.HasPrefix(l, "C8S-TESTINIT PORT "):
			ports = append(ports, l)
		case strings.HasPrefix(l, "C8S-TESTINIT RUNC "):
			if !strings.Contains(l, "runc version") {
				t.Errorf("unexpected runc --version output: %s", l)
			}
		}
		if mm := moduleLine.FindStringSubmatch(l); mm != nil {
			status[mm[1]] = mm[2]
		}
		t.Log(l)
	}
	if !ok {
		t.Fatalf("test init did not report success; console:\n%s", console)
	}
	if strings.Contains(console, "unable to open an initial console") {
		t.Error("the kernel found no /dev/console in the initramfs")
	}
	for _, mod := range modules {
		st, seen := status[mod]
		switch {
		case !seen:
			t.Errorf("module %s was not loaded", mod)
		case st == "nodev" && !platformModule(mod):
			t.Errorf("module %s returned ENODEV; only SEV/TDX guest drivers may", mod)
		}
	}
	if len(ports) != 1 || !strings.HasSuffix(ports[0], " "+bootPortName) {
		t.Errorf("virtio-serial ports = %q, want one named %s", ports, bootPortName)
	}
}

// platformModule reports whether mod is a confidential-computing guest driver
// whose init returns ENODEV on other platforms (as under TCG).
func platformModule(mod string) bool {
	base := filepath.Base(mod)
	return base == "sev-guest.ko" || base == "tdx-guest.ko"
}

// buildTestInitrd returns a copy of the image's initramfs with the test init
// as /init, and the module list of the image. It decompresses the cpio,
// appends a second archive holding only /init (the kernel unpacks archives in
// order, so the later /init replaces the agent) and compresses the result.
// (Appended after a zstd stream, an archive must start 4-byte aligned, as
// build.sh pads it; recompressing the whole is simpler here.)
func buildTestInitrd(t testing.TB, initrd string) (path string, modules []string) {
	t.Helper()
	tmp := t.TempDir()
	cpioPath := filepath.Join(tmp, "initrd-test.cpio")
	decompress := exec.Command("zstd", "-q", "-d", "-o", cpioPath, initrd)
	if out, err := decompress.CombinedOutput(); err != nil {
		t.Fatalf("decompress %s: %v: %s (run make deps)", initrd, err, out)
	}
	base, err := os.ReadFile(cpioPath)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := newc.ReadAll(bytes.NewReader(base))
	if err != nil {
		t.Fatalf("read initramfs %s: %v", initrd, err)
	}
	for _, e := range entries {
		if e.Name == "etc/c8s/modules" {
			modules = strings.Fields(string(e.Body))
		}
	}
	if len(modules) == 0 {
		t.Fatal("/etc/c8s/modules in the initramfs is missing or empty")
	}

	initPath := filepath.Join(tmp, "init")
	build := exec.Command("go", "build", "-trimpath", "-o", initPath, "./internal/testinit")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build test init: %v\n%s", err, out)
	}
	init, err := os.ReadFile(initPath)
	if err != nil {
		t.Fatal(err)
	}
	var extra bytes.Buffer
	w := newc.NewWriter(&extra)
	if err := w.Write(newc.Entry{Name: "init", Mode: newc.ModeRegular | 0o755, Body: init}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cpioPath, append(base, extra.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	// Compress again, so that the boot exercises the kernel's zstd support.
	path = cpioPath + ".zst"
	if out, err := exec.Command("zstd", "-q", "-3", "-o", path, cpioPath).CombinedOutput(); err != nil {
		t.Fatalf("compress test initramfs: %v: %s", err, out)
	}
	return path, modules
}
