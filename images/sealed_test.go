package images

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/images/manifest"
)

// sealedBoot boots the sealed image's kernel and first-stage initramfs with
// rootfs as its root disk and the manifest's command line plus extra, until
// the guest powers off.
func sealedBoot(t *testing.T, rootfs string, extra string) bootResult {
	t.Helper()
	dir := imageDir(t)
	m, err := manifest.Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Sealed() {
		t.Fatalf("the image in %s is not sealed (no rootfs/verity in its manifest): rebuild it with make image", dir)
	}
	kernel, _ := m.Path(dir, manifest.RoleKernel)
	initrd, _ := m.Path(dir, manifest.RoleInitrd)
	if rootfs == "" {
		rootfs, _ = m.Path(dir, manifest.RoleRootfs)
	}
	return bootQEMU(t, "-kernel", kernel, "-initrd", initrd, "-append", m.Cmdline+" "+extra,
		"-drive", "id=rootfs,file="+rootfs+",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-pci,drive=rootfs")
}

// TestBootSealedImage boots the sealed image as the launcher does: the
// first stage maps the verity root named on the command line, switches into
// it and starts the agent, which powers off at once (c8s_poweroff=1, the
// benchmark's baseline switch).
func TestBootSealedImage(t *testing.T) {
	r := sealedBoot(t, "", "c8s_poweroff=1")
	t.Logf("sealed boot to the agent took %v wall (TCG)", r.wall.Round(time.Millisecond))
	if strings.Contains(r.console, "c8s-init: fatal") {
		t.Fatalf("the first stage failed; console:\n%s", r.console)
	}
	if !strings.Contains(r.console, "reboot: Power down") {
		t.Fatalf("the guest did not power off cleanly; console:\n%s", r.console)
	}
}

// TestSealedRootRejectsAFlippedByte flips one byte of the erofs superblock
// in a copy of rootfs.img: dm-verity must refuse the block, the first stage
// must not mount the root, say why on the console and power off.
func TestSealedRootRejectsAFlippedByte(t *testing.T) {
	dir := imageDir(t)
	data, err := os.ReadFile(filepath.Join(dir, "rootfs.img"))
	if err != nil {
		t.Fatal(err)
	}
	data[1024+8] ^= 0x01 // inside the erofs superblock at 1 KiB
	bad := filepath.Join(t.TempDir(), "rootfs.img")
	if err := os.WriteFile(bad, data, 0o644); err != nil {
		t.Fatal(err)
	}
	r := sealedBoot(t, bad, "c8s_poweroff=1")
	for _, want := range []string{"verity", "data block 0 is corrupted", "c8s-init: fatal: the guest root file system on /dev/vda does not verify against root hash"} {
		if !strings.Contains(r.console, want) {
			t.Fatalf("console lacks %q; console:\n%s", want, r.console)
		}
	}
}
