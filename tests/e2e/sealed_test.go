package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/manifest"
)

// One VM: a copy of the sealed image's rootfs.img with one byte flipped
// (inside the erofs superblock) is refused by dm-verity in the guest's
// first stage; the pod fails with an error that says so, and nothing is
// left behind.
func testFlippedRootByte(t *testing.T, e *env) {
	data, err := os.ReadFile(filepath.Join(e.imageDir, "rootfs.img"))
	if err != nil {
		t.Fatal(err)
	}
	data[1024+16] ^= 0x80
	bad := filepath.Join(e.d.Dir, "flipped-rootfs.img")
	if err := os.WriteFile(bad, data, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(bad)
	cfg := e.writeConfig(t, "flipped.toml", fmt.Sprintf(`
[hypervisor]
kernel = %q
initrd = %q
rootfs = %q
[runtime]
state_dir = %q
`, filepath.Join(e.imageDir, "vmlinuz"), filepath.Join(e.imageDir, "initrd.img"), bad, e.stateDir))
	e.expectPodFails(t, cfg, "flipped", "QEMU exited during boot", "does not verify against root hash", "the image on the host was modified")
}

// One VM: the host swaps in another root disk whose hash tree is valid
// (the same file system re-hashed with another salt) and puts its root hash
// on the command line. The guest boots it, but the command line is
// measured: the sim TEE's modelled RTMR2 (as a TD's, checked through the
// event log) names another command line than the manifest's, and
// attestation fails naming the register and the event; nothing is left
// behind.
func testSwappedRootHash(t *testing.T, e *env) {
	m, err := manifest.Load(filepath.Join(e.imageDir, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.d.Dir, "swapped")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	data, err := os.ReadFile(filepath.Join(e.imageDir, "rootfs.img"))
	if err != nil {
		t.Fatal(err)
	}
	v := m.Verity
	dataBytes := int64(v.DataBlocks) * 4096
	rootfs := filepath.Join(dir, "rootfs.img")
	if err := os.WriteFile(rootfs, data[:dataBytes], 0o644); err != nil {
		t.Fatal(err)
	}
	salt := strings.Repeat("5a", 32)
	out, err := exec.Command("veritysetup", "format", fmt.Sprintf("--data-blocks=%d", v.DataBlocks),
		fmt.Sprintf("--hash-offset=%d", dataBytes), "--salt="+salt, rootfs, rootfs).CombinedOutput()
	if err != nil {
		t.Fatalf("veritysetup (make deps installs cryptsetup-bin): %v: %s", err, out)
	}
	match := regexp.MustCompile(`Root hash:\s+([0-9a-f]{64})`).FindSubmatch(out)
	if match == nil {
		t.Fatalf("no root hash in %s", out)
	}
	// The host's manifest for the swapped disk: new root hash and salt,
	// the same expected digests (they are what the verifier pins).
	swapped := *m
	sv := *m.Verity
	sv.RootHash, sv.Salt = string(match[1]), salt
	swapped.Verity = &sv
	swapped.Artifacts = map[string]manifest.Artifact{}
	for role, a := range m.Artifacts {
		swapped.Artifacts[role] = a
	}
	swapped.Artifacts[manifest.RoleRootfs], err = manifest.Describe(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := swapped.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := e.writeConfig(t, "swapped.toml", fmt.Sprintf(`
[hypervisor]
kernel = %q
initrd = %q
[attestation]
manifest = %q
[runtime]
state_dir = %q
`, filepath.Join(e.imageDir, "vmlinuz"), filepath.Join(e.imageDir, "initrd.img"), filepath.Join(dir, manifest.FileName), e.stateDir))
	stderr := e.expectPodFails(t, cfg, "swapped", "attestation of pod VM swapped failed", "RTMR2 event", "LOADED_IMAGE::LoadOptions, the kernel command line) mismatch")
	if strings.Contains(stderr, "does not verify") {
		t.Errorf("the swapped root did not boot; the test must reach attestation:\n%s", stderr)
	}
}
