package main

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

func TestRunWritesNamedImage(t *testing.T) {
	dir := t.TempDir()
	bb := filepath.Join(dir, "busybox")
	if err := os.WriteFile(bb, []byte("fake"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	// Flags after the output path, as in the documented usage.
	if err := run([]string{out, "--name", "docker.io/c8s/cli:v1", "--busybox", bb}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("index.json not found: %v", err)
		}
		if h.Name != ocispec.ImageIndexFile {
			continue
		}
		var idx ocispec.Index
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &idx); err != nil {
			t.Fatal(err)
		}
		if got := idx.Manifests[0].Annotations[ociimage.AnnotationImageName]; got != "docker.io/c8s/cli:v1" {
			t.Errorf("image name = %q", got)
		}
		return
	}
}

func TestRunRejectsBadArguments(t *testing.T) {
	for _, args := range [][]string{nil, {"a.tar", "b.tar"}, {"--name"}} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
