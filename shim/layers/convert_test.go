package layers

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// buildLauncher builds c8s-launcher, whose convert-layer Convert runs,
// and points Convert at it.
func buildLauncher(t *testing.T) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "c8s-launcher")
	// go test puts its own go first on PATH.
	build := exec.Command("go", "build", "-o", bin, "github.com/c8s-dev/c8s/launcher/cmd/c8s-launcher")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build c8s-launcher: %v\n%s", err, out)
	}
	Launcher = bin
	t.Cleanup(func() { Launcher = "" })
}

// Convert builds the disk measurements/layer builds from the
// uncompressed tar: the same diff ID, root and size from the gzip blob,
// through c8s-launcher convert-layer.
func TestConvert(t *testing.T) {
	buildLauncher(t)
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	body := []byte("hello from a layer\n")
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "etc/", Mode: 0o755})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/hello", Mode: 0o644, Size: int64(len(body))})
	tw.Write(body)
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarBuf.Bytes())
	zw.Close()

	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "gz.disk"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	info, err := Convert(context.Background(), bytes.NewReader(gz.Bytes()), ocispec.MediaTypeImageLayerGzip, out)
	if err != nil {
		t.Fatal(err)
	}
	if info.DiffID != digest.FromBytes(tarBuf.Bytes()) || len(info.RootHash) != 64 || info.DataBlocks == 0 {
		t.Fatalf("Convert = %+v, want the tar's diff ID %s", info, digest.FromBytes(tarBuf.Bytes()))
	}
	if st, _ := out.Stat(); st.Size() != info.Size {
		t.Fatalf("disk of %d bytes, Info says %d", st.Size(), info.Size)
	}
	plain, err := os.Create(filepath.Join(dir, "tar.disk"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	again, err := Convert(context.Background(), bytes.NewReader(tarBuf.Bytes()), ocispec.MediaTypeImageLayer, plain)
	if err != nil || again != info {
		t.Fatalf("the uncompressed blob: %+v, %v; want %+v", again, err, info)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	late, _ := os.Create(filepath.Join(dir, "cancelled.disk"))
	defer late.Close()
	if _, err := Convert(ctx, bytes.NewReader(tarBuf.Bytes()), ocispec.MediaTypeImageLayer, late); err == nil {
		t.Fatal("Convert with an ended context succeeded")
	}
	// A blob that is not what its media type says fails with the
	// converter's own error, and a writer that is not a file is refused.
	bad, _ := os.Create(filepath.Join(dir, "bad.disk"))
	defer bad.Close()
	if _, err := Convert(context.Background(), bytes.NewReader(tarBuf.Bytes()), ocispec.MediaTypeImageLayerGzip, bad); err == nil || !strings.Contains(err.Error(), "gzip") {
		t.Fatalf("a plain tar as gzip: %v, want the gzip error", err)
	}
	if _, err := Convert(context.Background(), bytes.NewReader(tarBuf.Bytes()), ocispec.MediaTypeImageLayer, nopSeeker{}); err == nil {
		t.Fatal("Convert into a non-file succeeded")
	}
}

type nopSeeker struct{ io.ReadWriteSeeker }
