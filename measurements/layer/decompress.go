package layer

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Layer media types: OCI's (image-spec media-types.md) and Docker's
// (image manifest v2, schema 2).
const (
	MediaTypeTar                 = "application/vnd.oci.image.layer.v1.tar"
	MediaTypeTarGzip             = "application/vnd.oci.image.layer.v1.tar+gzip"
	MediaTypeTarZstd             = "application/vnd.oci.image.layer.v1.tar+zstd"
	MediaTypeNondistributable    = "application/vnd.oci.image.layer.nondistributable.v1.tar"
	MediaTypeNondistributableGz  = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
	MediaTypeNondistributableZst = "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
	MediaTypeDockerTarGzip       = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	MediaTypeDockerForeignGzip   = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
)

// maxZstdWindow bounds the memory a zstd frame may ask for (zstd's
// default limit for decoders is 8 MiB; layers made with --long use more).
const maxZstdWindow = 128 << 20

// Decompress returns the uncompressed tar of a layer blob of mediaType:
// gzip, zstd or none, by OCI's and Docker's layer media types. Encrypted
// layers (ocicrypt's "+encrypted") and other types are refused: the node
// holds no keys, and a layer it cannot read cannot be pinned. Close
// releases the decompressor, not r. The caller reads to the end: gzip's
// checksum is checked there.
func Decompress(r io.Reader, mediaType string) (io.ReadCloser, error) {
	switch mediaType {
	case MediaTypeTar, MediaTypeNondistributable:
		return io.NopCloser(r), nil
	case MediaTypeTarGzip, MediaTypeNondistributableGz, MediaTypeDockerTarGzip, MediaTypeDockerForeignGzip:
		z, err := gzip.NewReader(bufio.NewReaderSize(r, 1<<20))
		if err != nil {
			return nil, fmt.Errorf("layer of type %s: %w", mediaType, err)
		}
		return z, nil
	case MediaTypeTarZstd, MediaTypeNondistributableZst:
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, fmt.Errorf("layer of type %s: %w", mediaType, err)
		}
		return z.IOReadCloser(), nil
	}
	if strings.Contains(mediaType, "+encrypted") {
		return nil, fmt.Errorf("layer of type %s is encrypted (ocicrypt): c8s converts layers on the node, which has no keys; build the image unencrypted and keep its secrets in the key broker", mediaType)
	}
	return nil, fmt.Errorf("layer of media type %q is not a layer c8s reads: want an OCI or Docker layer tar, uncompressed, gzip or zstd", mediaType)
}
