package layerimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

func TestWriteFile(t *testing.T) {
	if _, err := os.Stat(ociimage.DefaultBusybox); err != nil {
		t.Fatalf("%s: %v (install busybox-static: make deps)", ociimage.DefaultBusybox, err)
	}
	dir := t.TempDir()
	o := Options{Name: "docker.io/c8s/layers:test", Layers: [][]Entry{
		{{Name: "etc/app", Dir: true}, {Name: "etc/app/gone", Data: []byte("x")}, {Name: "big", Random: 3 << 20}},
		{{Name: "etc/app/gone", Whiteout: true}, {Name: "etc/app/top", Data: []byte("top\n")}},
	}}
	a, err := WriteFile(filepath.Join(dir, "a.tar"), o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := WriteFile(filepath.Join(dir, "b.tar"), o)
	if err != nil {
		t.Fatal(err)
	}
	ad, _ := os.ReadFile(filepath.Join(dir, "a.tar"))
	bd, _ := os.ReadFile(filepath.Join(dir, "b.tar"))
	if !bytes.Equal(ad, bd) || a.Manifest != b.Manifest {
		t.Fatal("two writes of one image differ")
	}
	if len(a.Layers) != 3 || a.Layers[1].Tar != nil || a.Layers[2].Tar == nil || a.Layers[0].Tar == nil {
		t.Fatalf("layers %+v", a.Layers)
	}
	// The blobs in the tarball unpack to the diff IDs; the top layer
	// holds the whiteout.
	blobs := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(ad))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		blobs[h.Name], _ = io.ReadAll(tr)
	}
	var idx ocispec.Index
	json.Unmarshal(blobs["index.json"], &idx)
	if idx.Manifests[0].Digest != a.Manifest || idx.Manifests[0].Annotations[ociimage.AnnotationImageName] != o.Name {
		t.Fatalf("index %+v", idx)
	}
	for i, l := range a.Layers {
		zr, err := gzip.NewReader(bytes.NewReader(blobs["blobs/sha256/"+l.Blob.Encoded()]))
		if err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		data, _ := io.ReadAll(zr)
		if digest.FromBytes(data) != l.DiffID {
			t.Fatalf("layer %d unpacks to %s, want %s", i, digest.FromBytes(data), l.DiffID)
		}
		if l.Tar != nil && !bytes.Equal(l.Tar, data) {
			t.Fatalf("layer %d: Tar is not the layer", i)
		}
	}
	names := map[string]bool{}
	tr = tar.NewReader(bytes.NewReader(a.Layers[2].Tar))
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names[h.Name] = true
	}
	if !names["etc/app/.wh.gone"] || !names["etc/app/top"] {
		t.Fatalf("top layer holds %v", names)
	}
}
