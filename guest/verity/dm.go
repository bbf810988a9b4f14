// Package verity activates the guest's dm-verity root device through the
// device-mapper ioctls (the same ones dmsetup and veritysetup issue), so
// that the first-stage init needs no userspace tools. The parameters come
// from the measured kernel command line (guest/api/verity).
package verity

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	api "github.com/c8s-dev/c8s/guest/api/verity"
)

// ControlPath is device-mapper's control device.
const ControlPath = "/dev/mapper/control"

// Device is an activated verity mapping.
type Device struct {
	// Name is the device-mapper name.
	Name string
	// Path is the block device node, e.g. /dev/dm-0.
	Path string
}

// Open maps p's device through a read-only verity target named name and
// waits up to wait for its node under devDir (devtmpfs) to appear.
func Open(name string, p api.Params, devDir string, wait time.Duration) (*Device, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	ctl, err := os.OpenFile(ControlPath, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open device-mapper control (is dm-mod loaded?): %w", err)
	}
	defer ctl.Close()
	fd := ctl.Fd()

	// The UUID names the root and the mapping, so that two mappings of one
	// tree (never made by c8s, but not the kernel's business to refuse)
	// do not collide on it.
	create := header(name, uuid(name, p.RootHash), 0)
	out, err := ioctl(fd, unix.DM_DEV_CREATE, create)
	if err != nil {
		return nil, fmt.Errorf("device-mapper: create %s: %w", name, err)
	}
	dev := hdr(out).Dev
	remove := func() {
		_, _ = ioctl(fd, unix.DM_DEV_REMOVE, header(name, "", 0))
	}
	if _, err := ioctl(fd, unix.DM_TABLE_LOAD, tableLoad(name, p)); err != nil {
		remove()
		return nil, fmt.Errorf("device-mapper: load the verity table for %s (%s): %w", p.Device, p.Table(), err)
	}
	// DM_DEV_SUSPEND without DM_SUSPEND_FLAG resumes the device, which makes
	// the loaded table live; verity then reads the hash tree's top levels.
	if _, err := ioctl(fd, unix.DM_DEV_SUSPEND, header(name, "", 0)); err != nil {
		remove()
		return nil, fmt.Errorf("device-mapper: activate %s: %w (the hash tree on %s does not match the root hash?)", name, err, p.Device)
	}
	path, err := waitNode(devDir, unix.Major(dev), unix.Minor(dev), wait)
	if err != nil {
		remove()
		return nil, err
	}
	return &Device{Name: name, Path: path}, nil
}

// uuid is the device-mapper UUID of mapping name of the tree with root
// hash root, at most 128 bytes (DM_UUID_LEN less its terminator).
func uuid(name, root string) string {
	u := "C8S-VERITY-" + root[:32] + "-" + name
	if len(u) > 128 {
		u = u[:128]
	}
	return u
}

// Remove removes the mapping named name. It fails with EBUSY while the
// device is open (mounted) and with ENXIO when there is no such mapping.
func Remove(name string) error {
	ctl, err := os.OpenFile(ControlPath, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open device-mapper control: %w", err)
	}
	defer ctl.Close()
	if _, err := ioctl(ctl.Fd(), unix.DM_DEV_REMOVE, header(name, "", 0)); err != nil {
		return fmt.Errorf("device-mapper: remove %s: %w", name, err)
	}
	return nil
}

// waitNode finds the devtmpfs node of block device major:minor.
func waitNode(devDir string, major, minor uint32, wait time.Duration) (string, error) {
	path := filepath.Join(devDir, fmt.Sprintf("dm-%d", minor))
	deadline := time.Now().Add(wait)
	for {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK &&
			unix.Major(st.Rdev) == major && unix.Minor(st.Rdev) == minor {
			return path, nil
		}
		if time.Now().After(deadline) {
			// devtmpfs did not create it (or not yet): make our own node.
			alt := filepath.Join(devDir, fmt.Sprintf(".c8s-dm-%d-%d", major, minor))
			if err := unix.Mknod(alt, unix.S_IFBLK|0o600, int(unix.Mkdev(major, minor))); err != nil && !errors.Is(err, unix.EEXIST) {
				return "", fmt.Errorf("device-mapper: no node for %d:%d after %v, and mknod failed: %w", major, minor, wait, err)
			}
			return alt, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// header returns a request with just the dm_ioctl header.
func header(name, uuid string, flags uint32) []byte {
	h := unix.DmIoctl{
		Version:    [3]uint32{unix.DM_VERSION_MAJOR, 0, 0},
		Data_size:  unix.SizeofDmIoctl,
		Data_start: unix.SizeofDmIoctl,
		Flags:      flags,
	}
	copy(h.Name[:len(h.Name)-1], name)
	copy(h.Uuid[:len(h.Uuid)-1], uuid)
	return headerBytes(&h, unix.SizeofDmIoctl)
}

// tableLoad returns a DM_TABLE_LOAD request with one read-only verity
// target spanning the data area.
func tableLoad(name string, p api.Params) []byte {
	params := append([]byte(p.Table()), 0)
	for (unix.SizeofDmTargetSpec+len(params))%8 != 0 {
		params = append(params, 0)
	}
	size := unix.SizeofDmIoctl + unix.SizeofDmTargetSpec + len(params)
	h := unix.DmIoctl{
		Version:      [3]uint32{unix.DM_VERSION_MAJOR, 0, 0},
		Data_size:    uint32(size),
		Data_start:   unix.SizeofDmIoctl,
		Target_count: 1,
		Flags:        unix.DM_READONLY_FLAG,
	}
	copy(h.Name[:len(h.Name)-1], name)
	buf := headerBytes(&h, size)
	spec := buf[unix.SizeofDmIoctl:]
	binary.NativeEndian.PutUint64(spec[0:], 0)           // sector_start
	binary.NativeEndian.PutUint64(spec[8:], p.Sectors()) // length
	binary.NativeEndian.PutUint32(spec[16:], 0)          // status
	binary.NativeEndian.PutUint32(spec[20:], 0)          // next: last target
	copy(spec[24:40], "verity")
	copy(spec[unix.SizeofDmTargetSpec:], params)
	return buf
}

func headerBytes(h *unix.DmIoctl, size int) []byte {
	buf := make([]byte, size)
	copy(buf, unsafe.Slice((*byte)(unsafe.Pointer(h)), unix.SizeofDmIoctl))
	return buf
}

func hdr(buf []byte) *unix.DmIoctl { return (*unix.DmIoctl)(unsafe.Pointer(&buf[0])) }

// ioctl issues a device-mapper request; the kernel writes its answer into
// the same buffer, which is returned.
func ioctl(fd uintptr, req uint, buf []byte) ([]byte, error) {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uintptr(req), uintptr(unsafe.Pointer(&buf[0])))
	if errno != 0 {
		return nil, errno
	}
	return buf, nil
}

// Corrupted reports whether the verity target of mapping name has met a
// block that does not verify against its tree: a status line starting
// with "C" (Documentation/admin-guide/device-mapper/verity.rst). The
// kernel sets it in every error mode and never clears it, so a read that
// failed with EIO at any time since the mapping was made shows.
func Corrupted(name string) (bool, error) {
	st, err := Status(name)
	if err != nil {
		return false, err
	}
	return ParseCorrupted(st)
}

// ParseCorrupted reads a verity status line: "V…" verified so far, "C…"
// corruption detected.
func ParseCorrupted(status string) (bool, error) {
	switch {
	case strings.HasPrefix(status, "C"):
		return true, nil
	case strings.HasPrefix(status, "V"):
		return false, nil
	}
	return false, fmt.Errorf("device-mapper: %q is not a verity status line (V or C first)", status)
}

// Status returns the verity target's status line ("V" verified, "C"
// corruption detected), for diagnostics.
func Status(name string) (string, error) {
	ctl, err := os.OpenFile(ControlPath, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer ctl.Close()
	const room = 4096
	buf := make([]byte, unix.SizeofDmIoctl+room)
	h := unix.DmIoctl{Version: [3]uint32{unix.DM_VERSION_MAJOR, 0, 0}, Data_size: uint32(len(buf)), Data_start: unix.SizeofDmIoctl}
	copy(h.Name[:len(h.Name)-1], name)
	copy(buf, headerBytes(&h, unix.SizeofDmIoctl))
	if _, err := ioctl(ctl.Fd(), unix.DM_TABLE_STATUS, buf); err != nil {
		return "", err
	}
	r := hdr(buf)
	if r.Target_count == 0 {
		return "", nil
	}
	spec := buf[r.Data_start:]
	return strings.TrimRight(string(spec[unix.SizeofDmTargetSpec:]), "\x00"), nil
}
