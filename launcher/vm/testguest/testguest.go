// Package testguest provides what launcher tests need to boot a real guest:
// a Debian kernel with the virtio drivers the tests use, and a busybox
// initramfs built around a test's /init script.
//
// The kernel is Debian's 6.12 cloud kernel (virtio_pci and virtio_console
// built in; the SCSI modules are shipped next to it). It is fetched once with
// `apt-get download` and extracted into the user cache directory, so a test
// machine needs apt access to Debian once. Tests skip, saying why, when QEMU
// or busybox is not installed.
package testguest

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/internal/newc"
)

// KernelPackage is the Debian package the test kernel comes from.
const KernelPackage = "linux-image-6.12.107+deb12-cloud-amd64-unsigned"

// SCSIModules are the modules a guest loads, in order, to see virtio-scsi
// disks; Kernel returns their paths under the module directory.
var SCSIModules = []string{"scsi_common", "scsi_mod", "sd_mod", "virtio_scsi"}

// QEMU returns the qemu-system-x86_64 path or skips the test.
func QEMU(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86); skipping VM test")
	}
	return p
}

// Kernel is an extracted test kernel.
type Kernel struct {
	// Path is the bzImage.
	Path string
	// Modules maps a module name from SCSIModules to its file: .ko when
	// the host has xz to decompress it (much faster than in a TCG guest),
	// else .ko.xz.
	Modules map[string]string
}

// GetKernel returns the test kernel, downloading and extracting it into the
// cache on first use. It fails the test when that is impossible.
func GetKernel(t testing.TB) Kernel {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "c8s", "test-kernel", KernelPackage)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("test kernel cache: %v", err)
	}
	// Packages are tested in parallel: serialise the download.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("test kernel cache lock: %v", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatalf("test kernel cache lock: %v", err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)

	k, ok := findKernel(dir)
	if ok {
		return decompressModules(k)
	}
	if err := fetchKernel(dir); err != nil {
		t.Fatalf("fetching the test kernel %s: %v\n(needs apt access to Debian bookworm, or %s=<path to the .deb>)", KernelPackage, err, KernelDebEnv)
	}
	k, ok = findKernel(dir)
	if !ok {
		t.Fatalf("test kernel %s extracted into %s but vmlinuz or modules are missing", KernelPackage, dir)
	}
	return decompressModules(k)
}

// decompressModules replaces .ko.xz modules by .ko files next to them when
// xz is available; it keeps the .ko.xz otherwise.
func decompressModules(k Kernel) Kernel {
	if _, err := exec.LookPath("xz"); err != nil {
		return k
	}
	for name, p := range k.Modules {
		ko := strings.TrimSuffix(p, ".xz")
		if _, err := os.Stat(ko); err != nil {
			if exec.Command("xz", "-dk", p).Run() != nil {
				continue
			}
		}
		k.Modules[name] = ko
	}
	return k
}

func findKernel(dir string) (Kernel, bool) {
	vmlinuz, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(vmlinuz) != 1 {
		return Kernel{}, false
	}
	k := Kernel{Path: vmlinuz[0], Modules: map[string]string{}}
	for _, m := range SCSIModules {
		p, _ := filepath.Glob(filepath.Join(dir, "lib", "modules", "*", "kernel", "drivers", "scsi", m+".ko.xz"))
		if len(p) != 1 {
			return Kernel{}, false
		}
		k.Modules[m] = p[0]
	}
	return k, true
}

// KernelDebEnv names an environment variable that may point at an already
// downloaded KernelPackage .deb, to avoid apt access.
const KernelDebEnv = "C8S_TEST_KERNEL_DEB"

func fetchKernel(dir string) error {
	tmp, err := os.MkdirTemp(dir, ".download-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	debs := []string{os.Getenv(KernelDebEnv)}
	if debs[0] == "" {
		if err := os.Chmod(tmp, 0o755); err != nil { // apt's _apt user writes here
			return err
		}
		cmd := exec.Command("apt-get", "download", KernelPackage)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get download: %v: %s", err, bytes.TrimSpace(out))
		}
		debs, _ = filepath.Glob(filepath.Join(tmp, "*.deb"))
		if len(debs) != 1 {
			return fmt.Errorf("apt-get download left %d .deb files", len(debs))
		}
	}
	// Extract only the kernel and the SCSI modules (the whole package is ~150 MB).
	script := `dpkg-deb --fsys-tarfile "$1" | tar -x -C "$2" --wildcards './boot/vmlinuz-*' './lib/modules/*/kernel/drivers/scsi/*'`
	if out, err := exec.Command("sh", "-c", script, "sh", debs[0], dir).CombinedOutput(); err != nil {
		return fmt.Errorf("extracting %s: %v: %s", filepath.Base(debs[0]), err, bytes.TrimSpace(out))
	}
	return nil
}

// Initramfs builds a gzip'ed newc initramfs in a test temp dir holding
// busybox (as /bin/busybox), the given /init script, and extra files
// (destination path inside the initramfs -> host path). It returns its path.
func Initramfs(t testing.TB, init string, files map[string]string) string {
	t.Helper()
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox is not installed (apt-get install busybox-static); skipping VM test")
	}
	if f, err := elf.Open(busybox); err == nil {
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				f.Close()
				t.Skipf("%s is dynamically linked; the test initramfs needs busybox-static", busybox)
			}
		}
		f.Close()
	}
	root := t.TempDir()
	write := func(dst string, data []byte, mode os.FileMode) {
		p := filepath.Join(root, dst)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	write("bin/busybox", bb, 0o755)
	write("init", []byte(init), 0o755)
	for dst, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		write(strings.TrimPrefix(dst, "/"), b, 0o644)
	}
	for _, d := range []string{"dev", "proc", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	out := filepath.Join(t.TempDir(), "initramfs.cpio.gz")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	cw := newc.NewWriter(zw)
	if err := newc.WriteTree(cw, root, 0); err != nil {
		t.Fatalf("initramfs: %v", err)
	}
	if err := cw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// QEMUChildren lists the pids of this process's child processes whose
// command is QEMU (a test's "nothing left behind" check).
func QEMUChildren(t testing.TB) []int {
	t.Helper()
	self := os.Getpid()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		line := string(b)
		open, close := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
		if open < 0 || close < open {
			continue
		}
		var pid, ppid int
		var state string
		fmt.Sscanf(line[:open], "%d", &pid)
		fmt.Sscanf(line[close+1:], " %s %d", &state, &ppid)
		if ppid == self && strings.HasPrefix(line[open+1:close], "qemu-system") {
			pids = append(pids, pid)
		}
	}
	return pids
}
