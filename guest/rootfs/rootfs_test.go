package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

func fakeSCSI(t *testing.T, sys, dev, addr, name string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(sys, "bus/scsi/devices", addr, "block", name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dev, name), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestFindSCSIDisk(t *testing.T) {
	root := t.TempDir()
	sys, dev := filepath.Join(root, "sys"), filepath.Join(root, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	fakeSCSI(t, sys, dev, "0:0:0:0", "sda")
	fakeSCSI(t, sys, dev, "0:0:1:0", "sdb")
	fakeSCSI(t, sys, dev, "2:0:1:3", "sdc")

	got, err := FindSCSIDisk(context.Background(), sys, dev, 1, 3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got != filepath.Join(dev, "sdc") {
		t.Errorf("disk = %s, want %s", got, filepath.Join(dev, "sdc"))
	}
	got, err = FindSCSIDisk(context.Background(), sys, dev, 1, 0, time.Second)
	if err != nil || got != filepath.Join(dev, "sdb") {
		t.Errorf("disk = %s, %v; want sdb", got, err)
	}
}

func TestFindSCSIDiskWaitsForHotplug(t *testing.T) {
	root := t.TempDir()
	sys, dev := filepath.Join(root, "sys"), filepath.Join(root, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		fakeSCSI(t, sys, dev, "0:0:4:0", "sdd")
	}()
	got, err := FindSCSIDisk(context.Background(), sys, dev, 4, 0, time.Minute)
	if err != nil || filepath.Base(got) != "sdd" {
		t.Errorf("disk = %s, %v; want sdd", got, err)
	}
}

func TestFindSCSIDiskMissing(t *testing.T) {
	root := t.TempDir()
	_, err := FindSCSIDisk(context.Background(), root, root, 9, 9, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "target 9 lun 9") {
		t.Errorf("err = %v, want one naming target 9 lun 9", err)
	}
}

func TestParseOptions(t *testing.T) {
	flags, data := ParseOptions([]string{"ro", "nosuid", "errors=remount-ro", "noatime", "atime", "defaults", "data=ordered"})
	if flags != unix.MS_RDONLY|unix.MS_NOSUID {
		t.Errorf("flags = %#x, want ro|nosuid", flags)
	}
	if data != "errors=remount-ro,data=ordered" {
		t.Errorf("data = %q", data)
	}
}

func TestMountAndUnmount(t *testing.T) {
	target := filepath.Join(t.TempDir(), "m")
	if err := Mount("c8s-test", "tmpfs", []string{"ro", "nodev", "size=1m"}, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil || len(infos) != 1 {
		t.Fatalf("mountinfo for %s: %v, %v", target, infos, err)
	}
	if opts := infos[0].Options; !strings.Contains(opts, "ro") || !strings.Contains(opts, "nodev") {
		t.Errorf("mount options = %q, want ro and nodev", opts)
	}
	if !strings.Contains(infos[0].VFSOptions, "size=1024k") {
		t.Errorf("fs options = %q, want size=1024k", infos[0].VFSOptions)
	}
	if err := Unmount(target); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := mountinfo.Mounted(target); mounted {
		t.Error("still mounted after Unmount")
	}
	if err := Unmount(target); err != nil {
		t.Errorf("second Unmount: %v, want nil", err)
	}
	if err := Mount("x", "", nil, target); err == nil {
		t.Error("mount without fstype accepted")
	}
}

// An address outside the virtio-scsi controller's range is refused before
// any scan is asked for: the kernel would read target 2^32-1 as a wildcard
// and scan every target.
func TestFindSCSIDiskRefusesAddressesOutOfRange(t *testing.T) {
	sysfs := t.TempDir()
	scan := filepath.Join(sysfs, "class/scsi_host/host0/scan")
	if err := os.MkdirAll(filepath.Dir(scan), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(scan, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, a := range [][2]uint32{{MaxSCSITarget + 1, 0}, {0, MaxSCSILUN + 1}, {^uint32(0), 0}} {
		_, err := FindSCSIDisk(context.Background(), sysfs, t.TempDir(), a[0], a[1], time.Second)
		if err == nil || !strings.Contains(err.Error(), "outside the virtio-scsi controller's") {
			t.Errorf("FindSCSIDisk(target %d, lun %d) = %v, want the address refused", a[0], a[1], err)
		}
		if b, _ := os.ReadFile(scan); len(b) != 0 {
			t.Errorf("FindSCSIDisk(target %d, lun %d) asked for a scan: %q", a[0], a[1], b)
		}
	}
}
