// Package stage1 is c8s-init, the first-stage init of a sealed guest image.
// It runs as PID 1 from a minimal initramfs, and does only what is needed
// to reach the measured root file system:
//
//  1. mount /proc, /sys and /dev;
//  2. read the dm-verity parameters from the (measured) kernel command line;
//  3. load the few modules of the initramfs (virtio-blk, device-mapper,
//     dm-verity, the root's file system);
//  4. map the root disk through dm-verity and mount it read-only, and mount
//     the initramfs's runtime tree read-only at RuntimeMount in it;
//  5. move /dev, /proc and /sys over, switch into it, and execute the agent
//     there.
//
// What the guest runs at every pod start lives in the measured initramfs
// rather than in the verified root, so that it runs from memory: the agent
// (Agent) and the OCI runtime with its libraries (RuntimeDir). Read through
// dm-verity, every page of their first run was hashed on the way in: 0.89 s
// of guest time from the agent's exec to its main and 0.34 s for crun's
// first start under emulation, against 0.04 s and 0.06 s from memory
// (issue 18). The launch measurement covers them as it covers this
// program. The first stage opens the agent before the switch, removes its
// name, and executes the open file in the new root (execveat with
// AT_EMPTY_PATH), so the agent that runs is the one the initramfs carries
// whatever names the new root has. The root reaches the runtime through
// symlinks into RuntimeMount (images/build.sh), which dangle unless this
// mount is in place: a missing runtime fails closed.
//
// If any step fails, notably when the root does not verify against the root
// hash, it writes the reason to the console (which the shim includes in the
// pod's error) and powers the VM off. It never runs anything unverified.
package stage1

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

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
	// Agent is the agent binary in the measured initramfs, which the
	// first stage executes as PID 1 in the verified root.
	Agent = "/c8s-agent"
	// AgentArg0 is the agent's argv[0].
	AgentArg0 = "c8s-agent"
	// RuntimeDir is the tree of the initramfs that holds the OCI runtime
	// and the libraries it links, at their paths below it.
	RuntimeDir = "/runtime"
	// RuntimeMount is where RuntimeDir appears, read-only, in the verified
	// root, which has an empty directory there.
	RuntimeMount = "/usr/lib/c8s/runtime"
	// deviceWait bounds the wait for the root disk to appear.
	deviceWait = 10 * time.Second
)

// Main runs the first stage. It does not return: it executes the agent in
// the verified root, or reports why it could not and powers the VM off.
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
	agent, err := os.Open(Agent)
	if err != nil {
		return fmt.Errorf("the initramfs carries no agent: %w; it is not a c8s sealed image's initrd.img (make image)", err)
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
	if err := mountRuntime(); err != nil {
		return err
	}
	return switchRoot(started, agent)
}

// switchRoot moves the API file systems into NewRoot, makes it / and
// executes agent there. The initramfs stays in memory but is no longer
// reachable; its files are removed first to give the memory back (the
// agent's pages stay while it runs from them). started, the uptime when
// the first stage began, goes to the agent for its boot log.
func switchRoot(started time.Duration, agent *os.File) error {
	for _, f := range []string{"/init", "/lib", "/etc", Agent} {
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
	return fmt.Errorf("execute the initramfs's %s in the verified root: %w", Agent, execFile(agent, []string{AgentArg0}, env))
}

// execFile executes the open file f (execveat(2) with AT_EMPTY_PATH), so
// that what runs is the file opened before the switch, whatever names the
// new root has. It returns only on failure.
func execFile(f *os.File, argv, env []string) error {
	empty, err := syscall.BytePtrFromString("")
	if err != nil {
		return err
	}
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return err
	}
	envp, err := syscall.SlicePtrFromStrings(env)
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall6(unix.SYS_EXECVEAT, f.Fd(), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), unix.AT_EMPTY_PATH, 0)
	if errno != 0 {
		return errno
	}
	return errors.New("execveat returned without an error")
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
