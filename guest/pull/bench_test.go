package pull

import (
	"archive/tar"
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
)

// BenchmarkPull pulls an image of one 64 MiB layer of incompressible
// content from the in-memory registry: the guest's work per byte
// (two digests, gzip, unpacking), without the network. Run it with
// GODEBUG=cpu.all=off to see it without the CPU's SHA and vector
// extensions, as under TCG's default CPU model.
func BenchmarkPull(b *testing.B) {
	const size = 64 << 20
	data := make([]byte, size)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(data)
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "blob", Mode: 0o644, Size: size, Typeflag: tar.TypeReg})
	tw.Write(data)
	tw.Close()
	t := &testing.T{}
	tr := newRegistry(t, false)
	ref := tr.push(t, "app", newImage(t, [][]byte{tb.Bytes()}, nil))
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		dir := b.TempDir()
		if _, err := Pull(context.Background(), ref, dir, Options{PlainHTTP: true}); err != nil {
			b.Fatal(err)
		}
	}
}
