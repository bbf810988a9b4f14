package layer

import (
	"bytes"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// FuzzBuild: any bytes either fail Build or give a disk whose hash tree
// verifies against the root Build returns, of Info.Size bytes, with the
// input's sha256 as diff ID. Never a panic.
func FuzzBuild(f *testing.F) {
	f.Add(tarOf(f, referenceEntries()...))
	f.Add(tarOf(f, file("a", 0o644, "x"), dir("b/", 0o755), file("b/.wh..wh..opq", 0, ""), file("b/.wh.c", 0, "")))
	f.Add(manyFiles(f, 8))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		out := &memDisk{}
		info, err := build(bytes.NewReader(data), out, 8<<20)
		if err != nil {
			return
		}
		if info.DiffID != digest.FromBytes(data) {
			t.Fatalf("DiffID %s, not the input's", info.DiffID)
		}
		if int64(len(out.b)) != info.Size || info.HashOffset() != int64(info.DataBlocks)*BlockSize {
			t.Fatalf("disk of %d bytes, Info %+v", len(out.b), info)
		}
		root, err := ParseRootHash(info.RootHash)
		if err != nil {
			t.Fatal(err)
		}
		if err := Verify(out, info.DataBlocks, root); err != nil {
			t.Fatal(err)
		}
	})
}
