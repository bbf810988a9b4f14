package images

import (
	"os"
	"path/filepath"
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
	return sealedBootWith(t, "", extra)
}

// sealedBootWith is sealedBoot with initrd (when not empty) in place of the
// image's initrd.img.
func sealedBootWith(t *testing.T, initrd, extra string) bootResult {
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
	if initrd == "" {
		initrd, _ = m.Path(dir, manifest.RoleInitrd)
	}
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

// TestSealedBootWithoutAgentFails boots the sealed image with only the
// first stage of initrd.img, without the archive that carries the agent:
// the first stage must refuse, saying so, and power off rather than look
// for an agent elsewhere (the verified root has none).
func TestSealedBootWithoutAgentFails(t *testing.T) {
	dir := imageDir(t)
	m, err := manifest.Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	path, _ := m.Path(dir, manifest.RoleInitrd)
	initrd, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off, _ := ramArchive(t, initrd)
	stage1Only := filepath.Join(t.TempDir(), "initrd-stage1-only.img")
	if err := os.WriteFile(stage1Only, initrd[:off], 0o644); err != nil {
		t.Fatal(err)
	}
	r := sealedBootWith(t, stage1Only, "c8s_poweroff=1")
	if !strings.Contains(r.console, "c8s-init: fatal: the initramfs carries no agent") {
		t.Fatalf("the first stage did not refuse an initramfs without the agent; console:\n%s", r.console)
	}
	if strings.Contains(r.console, "c8s-agent starting") {
		t.Fatalf("an agent started without the initramfs's; console:\n%s", r.console)
	}
}
