package layer

import (
	"bytes"
	"compress/gzip"
	"io"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
)

// Each layer media type decompresses to the same tar, so to the same diff
// ID and disk; encrypted and unknown types are refused.
func TestDecompress(t *testing.T) {
	raw := tarOf(t, referenceEntries()...)
	var gz, zs bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(raw)
	_ = zw.Close()
	enc, err := zstd.NewWriter(&zs)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = enc.Write(raw)
	_ = enc.Close()
	want, _ := buildFile(t, raw)
	for _, c := range []struct {
		media string
		blob  []byte
	}{
		{MediaTypeTar, raw},
		{MediaTypeNondistributable, raw},
		{MediaTypeTarGzip, gz.Bytes()},
		{MediaTypeDockerTarGzip, gz.Bytes()},
		{MediaTypeDockerForeignGzip, gz.Bytes()},
		{MediaTypeNondistributableGz, gz.Bytes()},
		{MediaTypeTarZstd, zs.Bytes()},
		{MediaTypeNondistributableZst, zs.Bytes()},
	} {
		r, err := Decompress(bytes.NewReader(c.blob), c.media)
		if err != nil {
			t.Fatalf("%s: %v", c.media, err)
		}
		info, err := Build(r, &memDisk{})
		if err != nil {
			t.Fatalf("%s: %v", c.media, err)
		}
		if err := r.Close(); err != nil {
			t.Error(err)
		}
		if info != want || info.DiffID != digest.FromBytes(raw) {
			t.Errorf("%s: %+v, want %+v", c.media, info, want)
		}
	}
	// A corrupt gzip stream fails at its checksum.
	bad := bytes.Clone(gz.Bytes())
	bad[len(bad)-6] ^= 1
	r, err := Decompress(bytes.NewReader(bad), MediaTypeTarGzip)
	if err == nil {
		_, err = io.Copy(io.Discard, r)
	}
	if err == nil {
		t.Error("a corrupt gzip layer reads")
	}
	for media, want := range map[string]string{
		"application/vnd.oci.image.layer.v1.tar+gzip+encrypted": "encrypted (ocicrypt)",
		"application/vnd.oci.image.layer.v1.tar+zstd+encrypted": "encrypted (ocicrypt)",
		"application/vnd.oci.image.config.v1+json":              "not a layer c8s reads",
		"": "not a layer c8s reads",
	} {
		if _, err := Decompress(bytes.NewReader(nil), media); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", media, err, want)
		}
	}
	if _, err := Decompress(strings.NewReader("not gzip"), MediaTypeTarGzip); err == nil {
		t.Error("a gzip layer that is not gzip opens")
	}
}
