package images

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/manifest"
)

// TestUKIMatchesSystemdMeasure checks the built UKI against systemd's own
// predictor: PCR 11 as systemd-measure computes it from the image's kernel,
// first-stage initrd and the UKI's command line and os-release sections must
// equal the manifest's, and the command line inside the UKI must be the
// manifest's (root hash included).
func TestUKIMatchesSystemdMeasure(t *testing.T) {
	const tool = "/usr/lib/systemd/systemd-measure"
	if _, err := os.Stat(tool); err != nil {
		t.Fatalf("%s not found: run make deps (package systemd)", tool)
	}
	dir := imageDir(t)
	m, err := manifest.Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	uki, err := m.Path(dir, manifest.RoleUKI)
	if err != nil {
		t.Fatal(err)
	}
	want, err := m.UKI()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	osrel, cmdline := filepath.Join(tmp, "osrel"), filepath.Join(tmp, "cmdline")
	if out, err := exec.Command("objcopy", "--dump-section", ".osrel="+osrel, "--dump-section", ".cmdline="+cmdline,
		uki, filepath.Join(tmp, "scratch.efi")).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v: %s", err, out)
	}
	if got, _ := os.ReadFile(cmdline); string(got) != m.Cmdline {
		t.Fatalf("the UKI's .cmdline is %q, the manifest's %q", got, m.Cmdline)
	}
	kernel, _ := m.Path(dir, manifest.RoleKernel)
	initrd, _ := m.Path(dir, manifest.RoleInitrd)
	out, err := exec.Command(tool, "calculate", "--json=short", "--phase=", "--bank=sha256", "--bank=sha384",
		"--linux="+kernel, "--initrd="+initrd, "--osrel="+osrel, "--cmdline="+cmdline).Output()
	if err != nil {
		t.Fatalf("systemd-measure: %v", err)
	}
	var ref map[string][]struct {
		PCR  int    `json:"pcr"`
		Hash string `json:"hash"`
	}
	if err := json.Unmarshal(out, &ref); err != nil {
		t.Fatalf("systemd-measure output %q: %v", out, err)
	}
	for _, bank := range []string{"sha256", "sha384"} {
		if len(ref[bank]) != 1 || !strings.EqualFold(ref[bank][0].Hash, want.PCR11[bank]) {
			t.Fatalf("PCR 11 %s: systemd-measure %v, manifest %s", bank, ref[bank], want.PCR11[bank])
		}
	}
}
