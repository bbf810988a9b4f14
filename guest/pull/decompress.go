package pull

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Layer media types (OCI's and Docker's).
const (
	mediaTypeTar       = "application/vnd.oci.image.layer.v1.tar"
	mediaTypeTarGzip   = "application/vnd.oci.image.layer.v1.tar+gzip"
	mediaTypeTarZstd   = "application/vnd.oci.image.layer.v1.tar+zstd"
	mediaTypeDockerGz  = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	mediaTypeDockerTar = "application/vnd.docker.image.rootfs.diff.tar"
)

// maxZstdWindow bounds the memory a zstd frame may ask for.
const maxZstdWindow = 128 << 20

// decompress returns the tar of a layer blob of mediaType. Close releases
// the decompressor, not r.
func decompress(r io.Reader, mediaType string) (io.ReadCloser, error) {
	switch mediaType {
	case mediaTypeTar, mediaTypeDockerTar:
		return io.NopCloser(r), nil
	case mediaTypeTarGzip, mediaTypeDockerGz:
		z, err := gzip.NewReader(bufio.NewReaderSize(r, 1<<16))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return z, nil
	case mediaTypeTarZstd:
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return z.IOReadCloser(), nil
	}
	if strings.Contains(mediaType, "+encrypted") {
		return nil, fmt.Errorf("media type %s: encrypted layers are not supported", mediaType)
	}
	return nil, fmt.Errorf("media type %q is not a layer the guest reads (an OCI or Docker layer tar: uncompressed, gzip or zstd)", mediaType)
}
