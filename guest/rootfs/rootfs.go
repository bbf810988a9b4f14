// Package rootfs finds a container's root filesystem disk in the guest and
// mounts it.
package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MaxSCSITarget and MaxSCSILUN are the largest target and LUN a
// virtio-scsi controller addresses (its max_target and max_lun).
const (
	MaxSCSITarget = 255
	MaxSCSILUN    = 16383
)

// FindSCSIDisk returns the /dev path of the disk at (target, lun) on the
// guest's virtio-scsi controller (channel 0, any host number), waiting up to
// timeout for a hotplugged disk and its device node to appear. sysfs and dev
// are the mount points of sysfs and devtmpfs ("/sys", "/dev" in the guest).
// The kernel's uevents wake the wait as a device comes (a short backoff
// catches what they miss), so a disk still being scanned is found as soon
// as the kernel has it, not at the next tick of a fixed poll. Each SCSI
// host is asked to scan the address (requestScan): with scsi_mod's
// scan=manual the guest scans only the addresses it needs, not all 256
// targets of the virtio-scsi controller.
func FindSCSIDisk(ctx context.Context, sysfs, dev string, target, lun uint32, timeout time.Duration) (string, error) {
	if target > MaxSCSITarget || lun > MaxSCSILUN {
		// Checked before any scan request: the host names the address, and
		// the kernel reads a target of 2^32-1 as "every target".
		return "", fmt.Errorf("scsi address target %d lun %d is outside the virtio-scsi controller's (target 0-%d, lun 0-%d): the host's request names no disk it can have attached", target, lun, MaxSCSITarget, MaxSCSILUN)
	}
	// Listening first: a disk that comes between a look and the wait
	// after it still wakes the wait.
	ev := newDeviceEvents()
	defer ev.Close()
	return findSCSIDisk(ctx, sysfs, dev, target, lun, timeout, ev)
}

func findSCSIDisk(ctx context.Context, sysfs, dev string, target, lun uint32, timeout time.Duration, ev deviceEvents) (string, error) {
	pattern := filepath.Join(sysfs, "bus/scsi/devices", fmt.Sprintf("*:0:%d:%d", target, lun), "block", "*")
	deadline := time.Now().Add(timeout)
	backoff := minPoll
	asked := map[string]bool{}
	var scanErr error
	for {
		matches, err := filepath.Glob(pattern)
		if err != nil {
			return "", fmt.Errorf("look for scsi disk %d:%d: %w", target, lun, err)
		}
		if len(matches) > 1 {
			return "", fmt.Errorf("scsi address %d:%d is ambiguous: %s", target, lun, strings.Join(matches, ", "))
		}
		if len(matches) == 1 {
			node := filepath.Join(dev, filepath.Base(matches[0]))
			if ready(node) {
				return node, nil
			}
		}
		if err := requestScan(sysfs, target, lun, asked); err != nil {
			scanErr = err
		}
		left := time.Until(deadline)
		if left <= 0 {
			err := fmt.Errorf("no disk at scsi target %d lun %d after %s (looked for %s): is the disk attached to the VM's virtio-scsi controller?", target, lun, timeout, pattern)
			if scanErr != nil {
				err = fmt.Errorf("%w (asking for a scan: %v)", err, scanErr)
			}
			return "", err
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
		ev.Wait(min(backoff, left))
		backoff = min(2*backoff, maxPoll)
	}
}

// requestScan asks each SCSI host of the guest that was not asked yet to
// scan channel 0, target, lun (the host's sysfs "scan" switch): a disk
// attached at boot is then found whatever scsi_mod's scan mode. With the
// default asynchronous scan the request is harmless; with scan=manual it
// is the only scan, of the one address asked. Only numbers reach the
// kernel; the disk found is still only what dm-verity or the pod's policy
// accept.
func requestScan(sysfs string, target, lun uint32, asked map[string]bool) error {
	hosts, err := filepath.Glob(filepath.Join(sysfs, "class/scsi_host/host*/scan"))
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hosts {
		if asked[h] {
			continue
		}
		asked[h] = true
		if err := os.WriteFile(h, []byte(fmt.Sprintf("0 %d %d", target, lun)), 0); err != nil {
			errs = append(errs, fmt.Errorf("scan %d:%d on %s: %w", target, lun, filepath.Base(filepath.Dir(h)), err))
		}
	}
	return errors.Join(errs...)
}

// ready reports whether the disk node exists and the driver has finished
// probing it: the node can appear while sd is still reading the capacity,
// and opening or mounting it then fails with ENXIO.
func ready(node string) bool {
	st, err := os.Stat(node)
	if err != nil {
		return false
	}
	if st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0 {
		return true // not a block device (a test's stand-in): existing is all
	}
	f, err := os.OpenFile(node, os.O_RDONLY, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	var size uint64
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size)))
	return errno == 0 && size > 0
}

// flagOptions are mount options that are mount(2) flags rather than
// filesystem data; the bool says whether the option clears the flag.
var flagOptions = map[string]struct {
	clear bool
	flag  uintptr
}{
	"ro":          {false, unix.MS_RDONLY},
	"rw":          {true, unix.MS_RDONLY},
	"nosuid":      {false, unix.MS_NOSUID},
	"suid":        {true, unix.MS_NOSUID},
	"nodev":       {false, unix.MS_NODEV},
	"dev":         {true, unix.MS_NODEV},
	"noexec":      {false, unix.MS_NOEXEC},
	"exec":        {true, unix.MS_NOEXEC},
	"sync":        {false, unix.MS_SYNCHRONOUS},
	"async":       {true, unix.MS_SYNCHRONOUS},
	"dirsync":     {false, unix.MS_DIRSYNC},
	"noatime":     {false, unix.MS_NOATIME},
	"atime":       {true, unix.MS_NOATIME},
	"nodiratime":  {false, unix.MS_NODIRATIME},
	"diratime":    {true, unix.MS_NODIRATIME},
	"relatime":    {false, unix.MS_RELATIME},
	"norelatime":  {true, unix.MS_RELATIME},
	"strictatime": {false, unix.MS_STRICTATIME},
	"mand":        {false, unix.MS_MANDLOCK},
	"nomand":      {true, unix.MS_MANDLOCK},
	"lazytime":    {false, unix.MS_LAZYTIME},
	"defaults":    {false, 0},
}

// ParseOptions splits fstab-style mount options into mount(2) flags and the
// filesystem's data string.
func ParseOptions(options []string) (uintptr, string) {
	var (
		flags uintptr
		data  []string
	)
	for _, o := range options {
		if f, ok := flagOptions[o]; ok {
			if f.clear {
				flags &^= f.flag
			} else {
				flags |= f.flag
			}
			continue
		}
		data = append(data, o)
	}
	return flags, strings.Join(data, ",")
}

// Mount mounts device (fstype, options) on target, creating target.
func Mount(device, fstype string, options []string, target string) error {
	if fstype == "" {
		return fmt.Errorf("mount %s on %s: no filesystem type given", device, target)
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	flags, data := ParseOptions(options)
	if err := unix.Mount(device, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s (%s, options %q) on %s: %w", device, fstype, strings.Join(options, ","), target, err)
	}
	return nil
}

// Unmount unmounts target if something is mounted there, lazily if it is
// busy. A target that does not exist or is not a mount point is not an error.
func Unmount(target string) error {
	err := unix.Unmount(target, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(target, unix.MNT_DETACH)
	}
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", target, err)
}
