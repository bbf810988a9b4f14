package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/manifest.golden.json")

// writeImage creates a fake image directory with a kernel and an initrd and
// returns the manifest that describes it.
func writeImage(t *testing.T) (string, *Manifest) {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"vmlinuz": "kernel bytes", "initrd.img": "initrd bytes"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := &Manifest{
		Schema:          Schema,
		Artifacts:       map[string]Artifact{},
		Kernel:          Kernel{Package: "linux-image-test", Version: "1.0", Release: "6.12.0-test"},
		Runc:            Package{Package: "runc", Version: "1.1.5"},
		Packages:        []Package{{Package: "linux-image-test", Version: "1.0"}, {Package: "runc", Version: "1.1.5"}},
		Cmdline:         "console=ttyS0 quiet panic=-1 no_timer_check",
		AgentSHA256:     strings.Repeat("ab", 32),
		SourceDateEpoch: 1700000000,
	}
	for role, name := range map[string]string{RoleKernel: "vmlinuz", RoleInitrd: "initrd.img"} {
		a, err := Describe(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		m.Artifacts[role] = a
	}
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, m
}

func TestMarshalGolden(t *testing.T) {
	_, m := writeImage(t)
	got, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "manifest.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (regenerate with: go test ./manifest -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("manifest encoding changed; if intended, run go test ./manifest -update\ngot:\n%s\nwant:\n%s", got, want)
	}
	back, err := Parse(want)
	if err != nil {
		t.Fatalf("golden manifest does not parse: %v", err)
	}
	if back.Artifacts[RoleKernel] != m.Artifacts[RoleKernel] || back.Kernel != m.Kernel || back.Cmdline != m.Cmdline {
		t.Errorf("round trip changed the manifest: %+v", back)
	}
}

func TestVerifyAcceptsIntactImage(t *testing.T) {
	dir, want := writeImage(t)
	got, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Artifacts[RoleInitrd].SHA256 != want.Artifacts[RoleInitrd].SHA256 {
		t.Errorf("Verify returned a different manifest")
	}
	if p, _ := got.Path(dir, RoleKernel); p != filepath.Join(dir, "vmlinuz") {
		t.Errorf("kernel path = %s", p)
	}
}

func TestVerifyNamesEveryMismatch(t *testing.T) {
	dir, _ := writeImage(t)
	if err := os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("tampered kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "initrd.img")); err != nil {
		t.Fatal(err)
	}
	_, err := Verify(dir)
	var verr *VerifyError
	if !errors.As(err, &verr) {
		t.Fatalf("Verify error = %v, want *VerifyError", err)
	}
	if len(verr.Mismatches) != 2 {
		t.Fatalf("mismatches = %v, want 2", verr.Mismatches)
	}
	msg := err.Error()
	for _, part := range []string{"kernel (vmlinuz): size 15", "initrd (initrd.img):", "make image"} {
		if !strings.Contains(msg, part) {
			t.Errorf("error %q does not mention %q", msg, part)
		}
	}
}

func TestLoadMissingHintsAtMakeImage(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), FileName))
	if err == nil || !strings.Contains(err.Error(), "make image") {
		t.Fatalf("Load of a missing manifest: %v", err)
	}
}

func TestParseRejectsBadManifests(t *testing.T) {
	_, m := writeImage(t)
	good, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(map[string]any)) []byte {
		var v map[string]any
		if err := json.Unmarshal(good, &v); err != nil {
			t.Fatal(err)
		}
		f(v)
		out, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	artifact := func(v map[string]any, role string) map[string]any {
		return v["artifacts"].(map[string]any)[role].(map[string]any)
	}
	cases := map[string][]byte{
		"not json":       []byte("{"),
		"trailing data":  append(append([]byte{}, good...), []byte("{}")...),
		"wrong schema":   edit(func(v map[string]any) { v["schema"] = "c8s.io/image-manifest/v0" }),
		"unknown field":  edit(func(v map[string]any) { v["extra"] = 1 }),
		"no kernel":      edit(func(v map[string]any) { delete(v["artifacts"].(map[string]any), RoleKernel) }),
		"path escape":    edit(func(v map[string]any) { artifact(v, RoleInitrd)["file"] = "../initrd.img" }),
		"absolute path":  edit(func(v map[string]any) { artifact(v, RoleInitrd)["file"] = "/etc/passwd" }),
		"short sha256":   edit(func(v map[string]any) { artifact(v, RoleKernel)["sha256"] = "abcd" }),
		"negative size":  edit(func(v map[string]any) { artifact(v, RoleKernel)["size"] = -1 }),
		"bad agent hash": edit(func(v map[string]any) { v["agent_sha256"] = "xyz" }),
		"bad package":    edit(func(v map[string]any) { v["packages"] = []any{map[string]any{"package": "x"}} }),
	}
	if _, err := Parse(good); err != nil {
		t.Fatalf("good manifest rejected: %v", err)
	}
	for name, data := range cases {
		if _, err := Parse(data); err == nil {
			t.Errorf("%s: Parse accepted %s", name, data)
		}
	}
}
