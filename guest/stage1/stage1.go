// Package stage1 is the first stage of a sealed guest image. The agent
// (guest/boot) is the sealed initramfs's /init, and as PID 1 it calls Run
// before anything else, in its own process: one Go runtime from the kernel
// to serving, rather than a first-stage program that executes the agent
// (under emulation each Go runtime's start is code QEMU must translate
// afresh; issue 18). Run does only what is needed to reach the measured
// root file system:
//
//  1. mount /proc and read the (measured) kernel command line; without
//     c8s.root= it stops there (the unsealed initramfs, initrd-plain.img);
//  2. mount /sys and /dev, and load the few modules of the initramfs
//     (virtio-blk, device-mapper, dm-verity, the root's file system, and
//     first, on a CPU with SSSE3, sha256_ssse3: the CPU's SHA-256 code for
//     dm-verity);
//  3. map the root disk through dm-verity and mount it read-only, and mount
//     the initramfs's runtime tree read-only at RuntimeMount in it (on
//     ramfs, so that crun runs straight from it: checkRuntimeMount);
//  4. remove the initramfs's files, move /dev, /proc and /sys over, and
//     make the verified root / (MS_MOVE, chroot, chdir).
//
// It then returns, and the same process goes on as the agent.
//
// What the guest runs at every pod start lives in the measured initramfs
// rather than in the verified root, so that it runs from memory: the agent
// (Init) and the OCI runtime with its libraries (RuntimeDir). Read through
// dm-verity, every page of their first run was hashed on the way in: 0.89 s
// of guest time from the agent's start to its main and 0.34 s for crun's
// first start under emulation, against 0.04 s and 0.06 s from memory
// (issue 18). The launch measurement covers them with the rest of
// initrd.img. The agent that runs is the one the kernel started from the
// initramfs, whatever names the verified root has. The root reaches the
// runtime through symlinks into RuntimeMount (images/build.sh), which
// dangle unless this mount is in place: a missing runtime fails closed.
//
// The initramfs decides nothing from the host but through the measured
// command line: a sealed initramfs (one with RuntimeDir) refuses to boot
// without c8s.root=, and an initramfs without RuntimeDir refuses to boot
// with it. If any step fails, notably when the root does not verify
// against the root hash, Run returns why; the caller hands that to Fail,
// which writes it to the console (the shim includes it in the pod's error)
// and powers the VM off. Nothing unverified runs.
package stage1

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/cpu"
	"golang.org/x/sys/unix"

	api "github.com/c8s-dev/c8s/guest/api/verity"
	"github.com/c8s-dev/c8s/guest/initsys"
	"github.com/c8s-dev/c8s/guest/verity"
)

const (
	// NewRoot is where the verified root is mounted before the switch.
	NewRoot = "/newroot"
	// MapperName is the device-mapper name of the verified root.
	MapperName = "c8s-root"
	// Init is the agent binary in the measured initramfs, which the
	// kernel runs as PID 1 and which runs the first stage.
	Init = "/init"
	// RuntimeDir is the tree of the sealed initramfs that holds the OCI
	// runtime and the libraries it links, at their paths below it. Only
	// the sealed initramfs has it.
	RuntimeDir = "/runtime"
	// RuntimeMount is where RuntimeDir appears, read-only, in the verified
	// root, which has an empty directory there.
	RuntimeMount = "/usr/lib/c8s/runtime"
	// FailPrefix starts the console line that says why the first stage
	// failed.
	FailPrefix = "c8s-agent: first stage failed: "
	// deviceWait bounds the wait for the root disk to appear.
	deviceWait = 10 * time.Second
)

// Run does the first stage when the kernel command line names a sealed
// root (c8s.root=): it returns true once the verified root is /, with the
// API file systems mounted in it. Without c8s.root= it returns false and
// has mounted /proc alone (the unsealed initramfs). An error means the VM
// must not go on: hand it to Fail.
func Run() (bool, error) {
	// The API file systems get the flags the agent mounts them with
	// (initsys), which then leaves these mounts in place.
	if err := initsys.Mount("/proc"); err != nil {
		return false, err
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return false, fmt.Errorf("read the kernel command line: %w", err)
	}
	p, sealed, err := plan(string(cmdline), isDir(RuntimeDir))
	if err != nil || !sealed {
		return false, err
	}
	for _, d := range []string{"/sys", "/dev"} {
		if err := initsys.Mount(d); err != nil {
			return false, err
		}
	}
	ssse3 := cpu.X86.HasSSSE3
	initsys.LoadModules(initsys.ModulesList, stage1Modules(ssse3))
	if err := waitBlock(p.Device, deviceWait); err != nil {
		return false, err
	}
	dev, err := verity.Open(MapperName, p, "/dev", 5*time.Second)
	if err != nil {
		return false, err
	}
	logVerityHash(ssse3)
	if err := os.MkdirAll(NewRoot, 0o755); err != nil {
		return false, err
	}
	if err := unix.Mount(dev.Path, NewRoot, p.FSType, unix.MS_RDONLY, ""); err != nil {
		status, _ := verity.Status(MapperName)
		return false, fmt.Errorf("the guest root file system on %s does not verify against root hash %s (mount %s as %s: %w; dm-verity status %q): the image on the host was modified, or the command line names another image",
			p.Device, p.RootHash, dev.Path, p.FSType, err, status)
	}
	if err := mountRuntime(); err != nil {
		return false, err
	}
	if err := checkRuntimeMount(NewRoot + RuntimeMount); err != nil {
		return false, err
	}
	if err := switchRoot(); err != nil {
		return false, err
	}
	return true, nil
}

// SHAModule is the initramfs's module of the CPU's SHA-256 code (SSSE3,
// AVX, AVX2 and SHA-NI implementations), which dm-verity hashes with once
// it is loaded; nothing else in the guest loads it.
const SHAModule = "/arch/x86/crypto/sha256-ssse3.ko"

// stage1Modules picks the first stage's modules: all of them, but for
// SHAModule on a CPU without SSSE3 (TCG's qemu64, sim pods' CPU). Each of
// the module's implementations needs one of SSSE3, AVX, AVX2 or SHA-NI,
// and every CPU with AVX or SHA-NI has SSSE3; on one without, the module
// would only refuse to load (ENODEV) after the kernel checked its
// signature, 41-55 ms of guest time under emulation (issue 18).
func stage1Modules(hasSSSE3 bool) func(path string) bool {
	return func(path string) bool { return hasSSSE3 || !strings.HasSuffix(path, SHAModule) }
}

// logVerityHash says which SHA-256 implementation the verified root's
// dm-verity table got when it was loaded (nothing has loaded since), and
// which the layer disks' get: on a CPU with SSSE3, what /proc/crypto says
// the crypto API gives (verity.SelectedHash), the CPU's code (SHA-NI,
// AVX2, AVX or SSSE3) once SHAModule loaded; else the portable C one,
// several times slower on hardware. It decides nothing.
func logVerityHash(hasSSSE3 bool) {
	if !hasSSSE3 {
		log.L.WithField("guest_uptime", initsys.Uptime()).Info("dm-verity hashes with sha256-generic, the kernel's portable SHA-256: this CPU has no SSSE3 for sha256_ssse3")
		return
	}
	if !initsys.Loaded(SHAModule) {
		log.L.Warn("sha256_ssse3 did not load on this CPU with SSSE3 (see the module's error above)")
	}
	text, err := os.ReadFile(verity.ProcCrypto)
	if err != nil {
		log.L.WithError(err).Warn("which SHA-256 implementation dm-verity uses is unknown")
		return
	}
	d, ok := verity.SelectedHash(text, api.HashAlgorithm)
	if !ok {
		log.L.Warnf("%s lists no %s implementation", verity.ProcCrypto, api.HashAlgorithm)
		return
	}
	log.L.WithField("guest_uptime", initsys.Uptime()).Infof("dm-verity hashes with %s (module %s)", d.Driver, d.Module)
}

// plan decides from the kernel command line, and from whether the
// initramfs is a sealed image's (it has RuntimeDir), whether to map a
// verified root and with which parameters.
func plan(cmdline string, sealedInitramfs bool) (api.Params, bool, error) {
	p, ok, err := api.FromCmdline(cmdline)
	switch {
	case err != nil:
		return api.Params{}, false, fmt.Errorf("%w; the launcher takes these parameters from the image manifest", err)
	case ok && !sealedInitramfs:
		return api.Params{}, false, fmt.Errorf("%s= is on the kernel command line, but this initramfs has no runtime tree %s: it is not a sealed image's initrd.img; boot initrd-plain.img without the manifest's verity parameters, or initrd.img with them", api.ParamRoot, RuntimeDir)
	case !ok && sealedInitramfs:
		return api.Params{}, false, fmt.Errorf("no %s= on the kernel command line: this initramfs only boots a sealed (dm-verity) root; start the VM with the image manifest's root disk and command line", api.ParamRoot)
	}
	return p, ok, nil
}

// switchRoot moves the API file systems into NewRoot and makes it / for
// the process (MS_MOVE, chroot, chdir). The initramfs stays in memory but
// is no longer reachable; its files are removed first to give the memory
// back (the pages of the running binary stay while it maps them).
// RuntimeDir stays: it is mounted in the new root.
func switchRoot() error {
	for _, f := range []string{Init, "/lib", "/etc"} {
		_ = os.RemoveAll(f)
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := unix.Mount(d, NewRoot+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s into the new root: %w", d, err)
		}
	}
	if err := unix.Chdir(NewRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot into the verified root: %w", err)
	}
	return unix.Chdir("/")
}

// mountRuntime bind-mounts the initramfs's RuntimeDir read-only (no
// set-uid, no devices) at RuntimeMount in the verified root.
func mountRuntime() error {
	dst := NewRoot + RuntimeMount
	if err := unix.Mount(RuntimeDir, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mount the initramfs's runtime tree %s at %s in the verified root: %w; initrd.img and rootfs.img are not of one image build (make image)", RuntimeDir, RuntimeMount, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make the runtime tree at %s read-only: %w", RuntimeMount, err)
	}
	return nil
}

// checkRuntimeMount checks that crun will run straight from the runtime
// tree mounted at path (runtimeFSProblem).
func checkRuntimeMount(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("statfs the runtime tree at %s: %w", path, err)
	}
	return runtimeFSProblem(path, int64(st.Type), int64(st.Flags))
}

// runtimeFSProblem says why a runtime tree at path on a file system of
// type fsType, mounted with the statfs flags, is not one crun runs
// straight from. On every call crun checks that its binary cannot be
// written to (CVE-2019-5736; cloned_binary.c): a file on a read-only
// mount passes, unless it answers F_GET_SEALS, as any tmpfs or hugetlbfs
// file does; crun then takes it for an unsealed memfd, copies itself into
// a sealed one and executes itself again, twice, at each create, start,
// kill and delete. The initramfs is a tmpfs unless the kernel command line
// says rootfstype=ramfs (launcher/vm.BaseKernelParams, measured): a tmpfs
// here means a command line that is not the launcher's.
func runtimeFSProblem(path string, fsType, flags int64) error {
	if flags&unix.ST_RDONLY == 0 {
		return fmt.Errorf("the runtime tree at %s is writable: it must be mounted read-only", path)
	}
	switch fsType {
	case unix.TMPFS_MAGIC:
		return fmt.Errorf("the runtime tree at %s is on tmpfs: crun would copy and execute itself again at every call (its check against CVE-2019-5736 takes tmpfs files for unsealed memfds); the kernel command line lacks rootfstype=ramfs, which every pod VM boots with (launcher/vm.BaseKernelParams)", path)
	case unix.HUGETLBFS_MAGIC:
		return fmt.Errorf("the runtime tree at %s is on hugetlbfs: crun would copy and execute itself again at every call (its check against CVE-2019-5736 takes hugetlbfs files for unsealed memfds); it must be the initramfs's, on ramfs", path)
	}
	return nil
}

// isDir reports whether path is a directory.
func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// waitBlock waits for the block device node path.
func waitBlock(path string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		var st unix.Stat_t
		err := unix.Stat(path, &st)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("root disk %s did not appear within %v (%v): the VM has no virtio-blk root disk; check hypervisor.rootfs / the image manifest", path, wait, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Fail reports err on the console, after FailPrefix, and powers the VM
// off. It never returns.
func Fail(err error) {
	msg := FailPrefix + err.Error() + "\n"
	if c, cerr := os.OpenFile("/dev/console", os.O_WRONLY|unix.O_NOCTTY, 0); cerr == nil {
		_, _ = c.WriteString(msg)
		_ = c.Close()
	} else {
		_, _ = os.Stderr.WriteString(msg)
	}
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}
