package ociimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ContentStoreDir is the directory of containerd's content store under
// its root (/var/lib/containerd).
const ContentStoreDir = "io.containerd.content.v1.content"

// OpenContentStore reads an image from containerd's content store: dir is
// the store (…/io.containerd.content.v1.content, whose blobs/sha256/<hex>
// are the blobs) or containerd's root holding it. The store keeps no
// names, so the image is named by the digest of its manifest or index
// (`ctr images ls` prints it); an index gives its linux/amd64 manifest.
// Layers containerd has not fetched (it unpacks and may discard them) are
// an error naming the layer when read.
func OpenContentStore(ctx context.Context, dir string, manifest digest.Digest) (*Image, error) {
	if err := manifest.Validate(); err != nil {
		return nil, fmt.Errorf("manifest digest %q: %w", manifest, err)
	}
	root := dir
	if _, err := os.Stat(filepath.Join(dir, "blobs")); errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(dir, ContentStoreDir, "blobs")); err == nil {
			root = filepath.Join(dir, ContentStoreDir)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "blobs")); err != nil {
		return nil, fmt.Errorf("%s is not containerd's content store (no blobs directory): give …/%s", dir, ContentStoreDir)
	}
	src := storeBlobs(root)
	// The store does not say what the blob is: read it to see.
	r, err := src.blob(ctx, ocispec.Descriptor{Digest: manifest})
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(r, maxJSON+1))
	r.Close()
	if err != nil {
		return nil, err
	}
	if len(data) > maxJSON {
		return nil, fmt.Errorf("blob %s is larger than a manifest may be", manifest)
	}
	desc := ocispec.Descriptor{MediaType: sniffMediaType(data), Digest: manifest, Size: int64(len(data))}
	if !isIndex(desc.MediaType) && !isManifest(desc.MediaType) {
		return nil, fmt.Errorf("blob %s is neither an image index nor a manifest (media type %q)", manifest, desc.MediaType)
	}
	img, err := fromDescriptor(ctx, src, root, desc)
	if err != nil {
		return nil, fmt.Errorf("content store %s: %w", root, err)
	}
	return img, nil
}

// storeBlobs is a content store's blobs directory.
type storeBlobs string

func (s storeBlobs) blob(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	d := desc.Digest
	if err := d.Validate(); err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(string(s), "blobs", d.Algorithm().String(), d.Encoded()))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("blob %s is not in the content store (containerd's CRI discards a layer once unpacked when discard_unpacked_layers is set; ctr content fetch gets it back)", d)
	}
	return f, err
}
