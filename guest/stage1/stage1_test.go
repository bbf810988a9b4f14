package stage1

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	rootParams = "c8s.root=/dev/vda c8s.rootfstype=erofs c8s.verity.roothash=4392bc4f7ed2fb4ebdd8b1cba7d1f1ec0c37b1fc34c2e9a5ef9e27b1ac11a8b6 c8s.verity.salt=00ff c8s.verity.blocks=100 c8s.verity.hashstart=101"
	baseParams = "console=ttyS0 quiet panic=-1 c8s.tee=sim"
)

// TestPlan checks the first stage's decision, which only the measured
// command line and the initramfs's own content drive: a sealed initramfs
// maps the root it names and refuses to boot without one (the host cannot
// make it serve from memory by dropping c8s.root=); an unsealed one boots
// without a root and refuses one, rather than ignore what the command line
// asks to verify.
func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		name           string
		cmdline        string
		sealed         bool
		wantSealed     bool
		wantErr        string
		wantDevice     string
		wantHashBlocks uint64
	}{
		{name: "sealed initramfs, verity root", cmdline: baseParams + " " + rootParams, sealed: true, wantSealed: true, wantDevice: "/dev/vda", wantHashBlocks: 101},
		{name: "unsealed initramfs, no root", cmdline: baseParams},
		{name: "sealed initramfs without c8s.root", cmdline: baseParams, sealed: true, wantErr: "no c8s.root= on the kernel command line: this initramfs only boots a sealed"},
		{name: "unsealed initramfs with c8s.root", cmdline: baseParams + " " + rootParams, wantErr: "it is not a sealed image's initrd.img"},
		{name: "incomplete verity parameters", cmdline: baseParams + " c8s.root=/dev/vda", sealed: true, wantErr: "c8s.verity.blocks= is missing"},
		{name: "bad root hash", cmdline: strings.Replace(rootParams, "roothash=4392", "roothash=zz92", 1), sealed: true, wantErr: "is not a hex sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, sealed, err := plan(tc.cmdline, tc.sealed)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("plan = %v, %v; want an error with %q", sealed, err, tc.wantErr)
				}
				if sealed {
					t.Fatal("plan failed, yet says to go on with a sealed root")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sealed != tc.wantSealed || p.Device != tc.wantDevice || p.HashStartBlock != tc.wantHashBlocks {
				t.Fatalf("plan = %+v, %v; want device %q, hash start %d, sealed %v", p, sealed, tc.wantDevice, tc.wantHashBlocks, tc.wantSealed)
			}
		})
	}
}

// TestRuntimeFSProblem checks which mounts of the runtime tree the first
// stage accepts: read-only, and not on a file system whose files answer
// F_GET_SEALS (crun would copy and execute itself again at every call).
func TestRuntimeFSProblem(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fsType  int64
		flags   int64
		wantErr string
	}{
		{name: "ramfs, read-only", fsType: unix.RAMFS_MAGIC, flags: unix.ST_RDONLY | unix.ST_NOSUID | unix.ST_NODEV},
		{name: "erofs, read-only", fsType: unix.EROFS_SUPER_MAGIC_V1, flags: unix.ST_RDONLY},
		{name: "tmpfs, read-only", fsType: unix.TMPFS_MAGIC, flags: unix.ST_RDONLY, wantErr: "lacks rootfstype=ramfs"},
		{name: "hugetlbfs, read-only", fsType: unix.HUGETLBFS_MAGIC, flags: unix.ST_RDONLY, wantErr: "is on hugetlbfs"},
		{name: "ramfs, writable", fsType: unix.RAMFS_MAGIC, wantErr: "is writable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := runtimeFSProblem("/rt", tc.fsType, tc.flags)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("runtimeFSProblem = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("runtimeFSProblem = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

// TestCheckRuntimeMount mounts a runtime tree as the first stage does (a
// read-only bind) from a ramfs and from a tmpfs, and checks that statfs
// tells them apart as runtimeFSProblem expects.
func TestCheckRuntimeMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestCheckRuntimeMount mounts file systems: run it as root (make test does)")
	}
	for _, tc := range []struct {
		fs      string
		wantErr string
	}{
		{fs: "ramfs"},
		{fs: "tmpfs", wantErr: "is on tmpfs"},
	} {
		t.Run(tc.fs, func(t *testing.T) {
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
			for _, d := range []string{src, dst} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := unix.Mount(tc.fs, src, tc.fs, 0, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Unmount(src, unix.MNT_DETACH) })
			if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Unmount(dst, unix.MNT_DETACH) })
			if err := checkRuntimeMount(dst); err == nil || !strings.Contains(err.Error(), "is writable") {
				t.Fatalf("a writable bind mount of %s: checkRuntimeMount = %v, want it refused as writable", tc.fs, err)
			}
			if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				t.Fatal(err)
			}
			err := checkRuntimeMount(dst)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("a read-only bind mount of %s: checkRuntimeMount = %v, want nil", tc.fs, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("a read-only bind mount of %s: checkRuntimeMount = %v, want an error with %q", tc.fs, err, tc.wantErr)
			}
		})
	}
}

// The first stage tries the CPU's SHA-256 module only where it can load.
func TestStage1Modules(t *testing.T) {
	const base = "/lib/modules/6.12.107+deb12-cloud-amd64/kernel"
	sha, blk := base+SHAModule, base+"/drivers/block/virtio_blk.ko"
	for _, tc := range []struct {
		ssse3    bool
		path     string
		wantLoad bool
	}{
		{true, sha, true},
		{false, sha, false},
		{true, blk, true},
		{false, blk, true},
	} {
		if got := stage1Modules(tc.ssse3)(tc.path); got != tc.wantLoad {
			t.Errorf("stage1Modules(SSSE3 %v)(%s) = %v, want %v", tc.ssse3, tc.path, got, tc.wantLoad)
		}
	}
}
