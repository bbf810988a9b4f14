// Package stage1 is c8s-init, the first-stage init of a sealed guest image.
// It runs as PID 1 from a minimal initramfs, and does only what is needed
// to reach the measured root file system:
//
//  1. mount /proc, /sys and /dev;
//  2. read the dm-verity parameters from the (measured) kernel command line;
//  3. load the few modules of the initramfs (virtio-blk, device-mapper,
//     dm-verity, the root's file system);
//  4. map the root disk through dm-verity and mount it read-only;
//  5. move /dev, /proc and /sys over, switch into it, and execute its /init
//     (c8s-agent).
//
// If any step fails, notably when the root does not verify against the root
// hash, it writes the reason to the console (which the shim includes in the
// pod's error) and powers the VM off. It never runs anything unverified.
package stage1

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

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
	// Init is the program started in the verified root.
	Init = "/init"
	// deviceWait bounds the wait for the root disk to appear.
	deviceWait = 10 * time.Second
)

// Main runs the first stage. It does not return: it executes Init in the
// verified root, or reports why it could not and powers the VM off.
func Main() {
	fail(run())
}

// run mounts the verified root and switches to it. It returns only when
// that fails, and then always with the error.
func run() error {
	started := initsys.Uptime()
	for _, m := range []struct{ src, dst, fstype string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	p, ok, err := api.FromCmdline(string(cmdline))
	if err != nil {
		return fmt.Errorf("%w; the launcher takes these parameters from the image manifest", err)
	}
	if !ok {
		return fmt.Errorf("no %s= on the kernel command line: this initramfs only boots a sealed (dm-verity) root; start the VM with the image manifest's root disk and command line", api.ParamRoot)
	}
	initsys.LoadModules(initsys.ModulesList, nil)
	if err := waitBlock(p.Device, deviceWait); err != nil {
		return err
	}
	dev, err := verity.Open(MapperName, p, "/dev", 5*time.Second)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(NewRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev.Path, NewRoot, p.FSType, unix.MS_RDONLY, ""); err != nil {
		status, _ := verity.Status(MapperName)
		return fmt.Errorf("the guest root file system on %s does not verify against root hash %s (mount %s as %s: %w; dm-verity status %q): the image on the host was modified, or the command line names another image",
			p.Device, p.RootHash, dev.Path, p.FSType, err, status)
	}
	if err := unix.Access(filepath.Join(NewRoot, Init), unix.X_OK); err != nil {
		return fmt.Errorf("the verified root has no executable %s: %w", Init, err)
	}
	return switchRoot(started)
}

// switchRoot moves the API file systems into NewRoot, makes it / and
// executes Init there. The initramfs stays in memory but is no longer
// reachable; its files are removed first to give the memory back. started,
// the uptime when the first stage began, goes to Init for its boot log.
func switchRoot(started time.Duration) error {
	for _, f := range []string{"/init", "/lib", "/etc"} {
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
		return err
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	env := append(os.Environ(), initsys.SwitchedEnv+"=1", initsys.Stage1UptimeEnv+"="+started.String(),
		initsys.Stage1ExecEnv+"="+initsys.Uptime().String())
	return fmt.Errorf("execute %s in the verified root: %w", Init, syscall.Exec(Init, []string{Init}, env))
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

// fail reports err on the console and powers the VM off.
func fail(err error) {
	msg := fmt.Sprintf("c8s-init: fatal: %v\n", err)
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
