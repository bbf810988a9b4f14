package images

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/stage1"
	"github.com/c8s-dev/c8s/internal/newc"
	"github.com/c8s-dev/c8s/manifest"
)

// sealedBoot boots the sealed image's kernel and initrd.img with
// its rootfs.img as the root disk and the manifest's command line plus extra, until
// the guest powers off.
func sealedBoot(t *testing.T, extra string) bootResult {
	t.Helper()
	return sealedBootWith(t, "", extra)
}

// sealedBootWith is sealedBoot with initrd (when not empty) in place of the
// image's initrd.img, and QEMU's qemuArgs added.
func sealedBootWith(t *testing.T, initrd, extra string, qemuArgs ...string) bootResult {
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
	return bootQEMU(t, append([]string{"-kernel", kernel, "-initrd", initrd, "-append", m.Cmdline + " " + extra,
		"-drive", "id=rootfs,file=" + rootfs + ",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-pci,drive=rootfs"}, qemuArgs...)...)
}

// TestBootSealedImage boots the sealed image as the launcher does: the
// agent, /init, runs the first stage in its own process (it maps the verity
// root named on the command line and switches into it) and then powers off
// at once (c8s_poweroff=1, the benchmark's baseline switch, which it reads
// only after the first stage).
func TestBootSealedImage(t *testing.T) {
	r := sealedBoot(t, "c8s_poweroff=1")
	t.Logf("sealed boot to the agent took %v wall (TCG)", r.wall.Round(time.Millisecond))
	if strings.Contains(r.console, stage1.FailPrefix) {
		t.Fatalf("the first stage failed; console:\n%s", r.console)
	}
	if !strings.Contains(r.console, "reboot: Power down") {
		t.Fatalf("the guest did not power off cleanly; console:\n%s", r.console)
	}
	// TCG's default CPU (qemu64) has no SSSE3: the first stage does not
	// try sha256_ssse3, which would refuse it (and LoadModules would name
	// it on the console).
	if want := "dm-verity hashes with sha256-generic, the kernel's portable SHA-256: this CPU has no SSSE3"; !strings.Contains(r.console, want) {
		t.Fatalf("the first stage did not say %q on qemu64; console:\n%s", want, r.console)
	}
	if strings.Contains(r.console, "sha256-ssse3.ko") {
		t.Fatalf("the first stage tried sha256_ssse3 on a CPU without SSSE3; console:\n%s", r.console)
	}
}

// TestSealedBootHashesWithCPUInstructions boots the sealed image on a CPU
// with AVX2 (TCG's "max"; TCG 7.2 has no SHA instructions): the first stage
// loads the initramfs's sha256_ssse3 before it maps the root, so dm-verity
// hashes the root, and later the layer disks, with the CPU's vector code
// rather than the portable C (several times slower on SNP and TDX hosts;
// under TCG either is emulated, so this checks the choice, not the speed).
func TestSealedBootHashesWithCPUInstructions(t *testing.T) {
	r := sealedBootWith(t, "", "c8s_poweroff=1", "-cpu", "max")
	if strings.Contains(r.console, stage1.FailPrefix) {
		t.Fatalf("the first stage failed; console:\n%s", r.console)
	}
	if want := "dm-verity hashes with sha256-avx2 (module sha256_ssse3)"; !strings.Contains(r.console, want) {
		t.Fatalf("the first stage did not say %q; console:\n%s", want, r.console)
	}
}

// TestSealedBootOnTmpfsFails boots the sealed image with a command line
// whose last rootfstype= makes the initramfs a tmpfs again (the kernel
// keeps the last): the first stage refuses the runtime tree there, where
// crun would copy and execute itself again at every call, and names the
// parameter the launcher's command line has (launcher/vm.BaseKernelParams).
// c8s_poweroff=1 ends a boot that got past the first stage at once.
func TestSealedBootOnTmpfsFails(t *testing.T) {
	r := sealedBoot(t, "rootfstype=tmpfs c8s_poweroff=1")
	if !strings.Contains(r.console, stage1.FailPrefix) || !strings.Contains(r.console, "is on tmpfs") || !strings.Contains(r.console, "lacks rootfstype=ramfs") {
		t.Fatalf("the first stage did not refuse a runtime tree on tmpfs; console:\n%s", r.console)
	}
}

// TestSealedBootWithoutAgentRunsNothing boots the sealed image with only
// the first archive of initrd.img, without the one that carries the agent:
// that archive holds the first stage's modules and no program, so the
// kernel finds no /init and stops (the command line names no root= for it
// to mount the unverified disk instead); nothing of the initramfs runs.
func TestSealedBootWithoutAgentRunsNothing(t *testing.T) {
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
	firstOnly := filepath.Join(t.TempDir(), "initrd-first-archive-only.img")
	if err := os.WriteFile(firstOnly, initrd[:off], 0o644); err != nil {
		t.Fatal(err)
	}
	r := sealedBootWith(t, firstOnly, "c8s_poweroff=1")
	if !strings.Contains(r.console, "Kernel panic") {
		t.Fatalf("the kernel did not stop for want of an init; console:\n%s", r.console)
	}
	for _, s := range []string{"c8s-agent starting", stage1.FailPrefix} {
		if strings.Contains(r.console, s) {
			t.Fatalf("something ran without the initramfs's agent (%q on the console); console:\n%s", s, r.console)
		}
	}
}

// TestSealedBootWithoutRuntimeFails boots the sealed image with initrd.img's
// second archive replaced by one that holds the agent alone, without the
// runtime tree: the first stage must refuse, saying why on the console, and
// power the VM off before anything else of the agent runs.
func TestSealedBootWithoutRuntimeFails(t *testing.T) {
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
	off, entries := ramArchive(t, initrd)
	var buf bytes.Buffer
	buf.Write(initrd[:off])
	w := newc.NewWriter(&buf)
	for _, e := range entries {
		if e.Name == strings.TrimPrefix(stage1.Init, "/") {
			if err := w.Write(e); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	agentOnly := filepath.Join(t.TempDir(), "initrd-agent-only.img")
	if err := os.WriteFile(agentOnly, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// No c8s_poweroff: an agent that went on past a failed first stage
	// would log its start.
	r := sealedBootWith(t, agentOnly, "")
	if want := stage1.FailPrefix + "c8s.root= is on the kernel command line, but this initramfs has no runtime tree"; !strings.Contains(r.console, want) {
		t.Fatalf("the first stage did not refuse an initramfs without the runtime tree (want %q); console:\n%s", want, r.console)
	}
	if !strings.Contains(r.console, "reboot: Power down") {
		t.Fatalf("the guest did not power off; console:\n%s", r.console)
	}
	if strings.Contains(r.console, "c8s-agent starting") {
		t.Fatalf("the agent went on after the first stage failed; console:\n%s", r.console)
	}
}
