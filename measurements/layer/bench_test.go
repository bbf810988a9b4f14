package layer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// benchLayer is a layer of about mib MiB as images have them: a few large
// files, half of random bytes and half of text, and many small ones.
func benchLayer(b *testing.B, mib int) []byte {
	b.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	r := rand.NewChaCha8([32]byte{'b'})
	add := func(name string, data []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(1700000000, 0)}); err != nil {
			b.Fatal(err)
		}
		_, _ = tw.Write(data)
	}
	text := bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog\n"), 1<<20/44+1)[:1<<20]
	for i := 0; buf.Len() < mib<<20*3/4; i++ {
		data := text
		if i%2 == 0 {
			data = make([]byte, 1<<20)
			_, _ = r.Read(data)
		}
		add(fmt.Sprintf("usr/lib/big/%04d.so", i), data)
	}
	small := make([]byte, 2000)
	for i := 0; buf.Len() < mib<<20; i++ {
		_, _ = r.Read(small[:1000])
		add(fmt.Sprintf("usr/share/d%03d/f%05d", i%500, i), small[:500+i%1500])
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkBuild converts a layer into its disk (ext4 and hash tree, in
// a file), from the tar and from its gzip blob as the node converts a
// pulled layer. MiB/s is of the uncompressed tar; s/GiB is the first
// conversion's time per GiB of layer. C8S_LAYER_BENCH_MIB sets the
// layer's size (64 MiB by default; make bench uses 256).
func BenchmarkBuild(b *testing.B) {
	mib := 64
	if s := os.Getenv("C8S_LAYER_BENCH_MIB"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("C8S_LAYER_BENCH_MIB=%q", s)
		}
		mib = n
	}
	raw := benchLayer(b, mib)
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	_, _ = zw.Write(raw)
	_ = zw.Close()
	for _, c := range []struct {
		name, media string
		blob        []byte
	}{{"tar", MediaTypeTar, raw}, {"gzip", MediaTypeTarGzip, gz.Bytes()}} {
		b.Run(fmt.Sprintf("%s/%dMiB", c.name, mib), func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			dir := b.TempDir()
			for i := 0; b.Loop(); i++ {
				f, err := os.Create(filepath.Join(dir, strconv.Itoa(i)))
				if err != nil {
					b.Fatal(err)
				}
				r, err := Decompress(bytes.NewReader(c.blob), c.media)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Build(r, f); err != nil {
					b.Fatal(err)
				}
				f.Close()
				os.Remove(f.Name())
			}
			perGiB := b.Elapsed().Seconds() / float64(b.N) / (float64(len(raw)) / (1 << 30))
			b.ReportMetric(perGiB, "s/GiB")
		})
	}
}
