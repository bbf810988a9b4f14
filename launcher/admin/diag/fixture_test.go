package diag

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/manifest"
)

// fixtureHosts are the fixture trees whose image directory holds a
// manifest.json.
var fixtureHosts = []string{"plain-host", "snp-host", "tdx-host"}

// TestFixtureManifests checks that each fixture tree's manifest.json records
// the command line an image built by this launcher has: vm.BaseKernelParams
// (no verity root, so nothing else), in manifest.Marshal's encoding. Its
// artefacts stay as they are: plain-host's initrd.img is tampered with on
// purpose, and the image check's goldens cover them. With -update
// (internal/golden's flag) it rewrites the manifests, e.g. after
// vm.BaseKernelParams changed.
func TestFixtureManifests(t *testing.T) {
	update := flag.Lookup("update")
	if update == nil {
		t.Fatal("no -update flag: internal/golden registers it and diag's tests import it")
	}
	for _, host := range fixtureHosts {
		dir := filepath.Join("testdata", host, "usr", "local", "share", "c8s")
		path := filepath.Join(dir, manifest.FileName)
		m, err := manifest.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		m.Cmdline = vm.BaseKernelParams
		got, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if update.Value.String() == "true" {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s does not record cmdline %q (vm.BaseKernelParams) in manifest.Marshal's encoding; "+
				"regenerate it with go test ./launcher/admin/diag -run TestFixtureManifests -update:\n%s", path, vm.BaseKernelParams, got)
		}
	}
}
