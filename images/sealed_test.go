package images

import (
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/manifest"
)

// sealedBoot boots the sealed image's kernel and first-stage initramfs with
// its rootfs.img as the root disk and the manifest's command line plus extra, until
// the guest powers off.
func sealedBoot(t *testing.T, extra string) bootResult {
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
	rootfs, _ := m.Path(dir, manifest.RoleRootfs)
	return bootQEMU(t, "-kernel", kernel, "-initrd", initrd, "-append", m.Cmdline+" "+extra,
		"-drive", "id=rootfs,file="+rootfs+",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-pci,drive=rootfs")
}

// TestBootSealedImage boots the sealed image as the launcher does: the
// first stage maps the verity root named on the command line, switches into
// it and starts the agent, which powers off at once (c8s_poweroff=1, the
// benchmark's baseline switch).
func TestBootSealedImage(t *testing.T) {
	r := sealedBoot(t, "c8s_poweroff=1")
	t.Logf("sealed boot to the agent took %v wall (TCG)", r.wall.Round(time.Millisecond))
	if strings.Contains(r.console, "c8s-init: fatal") {
		t.Fatalf("the first stage failed; console:\n%s", r.console)
	}
	if !strings.Contains(r.console, "reboot: Power down") {
		t.Fatalf("the guest did not power off cleanly; console:\n%s", r.console)
	}
}
