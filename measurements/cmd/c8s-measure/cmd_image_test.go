package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	toml "github.com/pelletier/go-toml/v2"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/measurements/internal/ociimage"
	"github.com/c8s-dev/c8s/measurements/internal/ocilayout"
)

// imageLayout writes a layout of a three-layer multi-platform image.
func imageLayout(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	ds, err := ocilayout.Write(dir, ocilayout.Image{Name: "example.com/app:1", MultiPlatform: true, Config: ocispec.ImageConfig{Cmd: []string{"/app"}},
		Layers: []map[string]string{
			{"bin/app": "#!/bin/sh\necho hi\n", "etc/passwd": "root:x:0:0::/:/bin/sh\n"},
			{"etc/.wh.passwd": ""},
			{"srv/data": strings.Repeat("d", 50000)},
		}})
	if err != nil {
		t.Fatal(err)
	}
	return dir, ds[0].String()
}

// `c8s-measure image` reads the same image from a local registry (by tag
// and by digest), its layout, a tar of the layout and containerd's content
// store, and prints the same layers, which are the diff IDs of the config
// and what the policy's layers are.
func TestImageCommand(t *testing.T) {
	dir, index := imageLayout(t)
	reg := ocilayout.StartRegistry(t)
	if err := ocilayout.Push(reg, "c8s/app", "1", dir, digest.Digest(index)); err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(t.TempDir(), "app.oci.tar")
	if err := ocilayout.WriteTar(tarball, dir); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(t.TempDir(), ociimage.ContentStoreDir)
	if err := os.CopyFS(filepath.Join(store, "blobs"), os.DirFS(filepath.Join(dir, "blobs"))); err != nil {
		t.Fatal(err)
	}
	var want *imageJSON
	for _, args := range [][]string{
		{reg + "/c8s/app:1"},
		{reg + "/c8s/app@" + index},
		{dir},
		{tarball, "--ref", "example.com/app:1"},
		{"--content-store", store, "--manifest", index},
	} {
		stdout, stderr, err := measureWarn(runImage, append(args, "-o", "json")...)
		if err != nil {
			t.Fatalf("%q: %v\n%s", args, err, stderr)
		}
		var got imageJSON
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatalf("%q: %v\n%s", args, err, stdout)
		}
		got.Image = ""
		if want == nil {
			want = &got
			continue
		}
		if !reflect.DeepEqual(&got, want) {
			t.Errorf("%q: %+v, want %+v", args, got, *want)
		}
	}
	// What it says is what the image is: its digests, its config's diff
	// IDs, and the disks the node builds.
	img, err := ociimage.OpenLayout(t.Context(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	measured, err := ociimage.MeasureLayers(t.Context(), img, "")
	if err != nil {
		t.Fatal(err)
	}
	if want.Digests[0].String() != index || want.Manifest != img.ManifestDigest() || want.Config != img.Manifest.Config.Digest || len(want.Layers) != 3 {
		t.Fatalf("json %+v", *want)
	}
	for i, l := range want.Layers {
		m := measured[i]
		if l.Digest != m.Blob.Digest || l.MediaType != m.Blob.MediaType || l.DiffID != img.ConfigFile.RootFS.DiffIDs[i] ||
			l.Verity != m.Disk.RootHash || l.DataBlocks != m.Disk.DataBlocks || l.DiskSize != m.Disk.Size {
			t.Errorf("layer %d: %+v, want %+v", i, l, m)
		}
	}

	// -o toml: the rule's layer tables, which parse as the policy's.
	stdout, _, err := measureWarn(runImage, reg+"/c8s/app:1", "-o", "toml", "--container", "app")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Policy struct {
			Containers map[string]struct {
				Layers []policyapi.Layer `toml:"layers"`
			} `toml:"containers"`
		} `toml:"policy"`
	}
	if err := toml.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	got := doc.Policy.Containers["app"].Layers
	if len(got) != 3 {
		t.Fatalf("toml layers %+v\n%s", got, stdout)
	}
	for i, l := range got {
		if l.Digest != want.Layers[i].DiffID.String() || l.Verity != want.Layers[i].Verity || l.Blocks != want.Layers[i].DataBlocks {
			t.Errorf("toml layer %d: %+v, want %+v", i, l, want.Layers[i])
		}
	}

	// The table names every value.
	stdout, _, err = measureWarn(runImage, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"manifest  " + want.Manifest.String(), "config    " + want.Config.String(), "index     " + index,
		want.Layers[2].Digest.String(), want.Layers[2].DiffID.String(), want.Layers[2].Verity} {
		if !strings.Contains(stdout, s) {
			t.Errorf("the table has no %q:\n%s", s, stdout)
		}
	}
}

// A layout whose layer blob was swapped for another is refused, naming
// the layer; and usage errors.
func TestImageCommandRefuses(t *testing.T) {
	dir, index := imageLayout(t)
	img, err := ociimage.OpenLayout(t.Context(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	l := img.Manifest.Layers[2].Digest
	blob := filepath.Join(dir, "blobs", "sha256", l.Encoded())
	data, _ := os.ReadFile(blob)
	data[len(data)/2] ^= 1
	if err := os.WriteFile(blob, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := measureWarn(runImage, dir); err == nil || !strings.Contains(err.Error(), "layer 3 ("+l.String()+")") {
		t.Errorf("a changed layer: %v", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "want one image"},
		{[]string{dir, "-o", "yaml"}, `-o "yaml"`},
		{[]string{"--content-store", dir}, "needs --manifest"},
		{[]string{dir, "--manifest", index}, "--manifest goes with --content-store"},
		{[]string{"./missing"}, "no such file"},
		{[]string{"127.0.0.1:1/x:1", "--ref", "y"}, "--ref picks an image of a layout"},
		{[]string{"Not A Ref"}, "is not a repository name"},
	} {
		if _, _, err := measureWarn(runImage, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.args, err, c.want)
		}
	}
}
