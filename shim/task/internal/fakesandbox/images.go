package fakesandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/launcher/ctrdimage"
	"github.com/c8s-dev/c8s/shim/layers"
)

// Images is containerd's images as the fake host serves them (layer
// mode): containers run images whose layer blobs are their own "tar", so
// that ConvertLayer's diff ID of a blob is its digest. A container no
// test ran has no image.
type Images struct {
	mu         sync.Mutex
	containers map[string]ctrdimage.Image
	blobs      map[digest.Digest][]byte
	opened     int
	closed     int
}

// NewImages returns containerd without images.
func NewImages() *Images {
	return &Images{containers: map[string]ctrdimage.Image{}, blobs: map[digest.Digest][]byte{}}
}

// Image stores an image whose layers hold the given contents, bottom
// first.
func (i *Images) Image(name string, layerContents ...string) ctrdimage.Image {
	i.mu.Lock()
	defer i.mu.Unlock()
	im := ctrdimage.Image{Name: name}
	for _, c := range layerContents {
		data := []byte(strings.Repeat(c, 64))
		d := digest.FromBytes(data)
		i.blobs[d] = data
		im.Layers = append(im.Layers, ctrdimage.Layer{DiffID: d, Blob: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: d, Size: int64(len(data))}})
	}
	return im
}

// Run makes container id one of image im.
func (i *Images) Run(id string, im ctrdimage.Image) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.containers[id] = im
}

// DropBlob removes a blob from the content store.
func (i *Images) DropBlob(d digest.Digest) {
	i.mu.Lock()
	defer i.mu.Unlock()
	delete(i.blobs, d)
}

// Balanced reports whether every OpenImages was closed.
func (i *Images) Balanced() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.opened == i.closed
}

// ContainerImage returns the image Run gave container id.
func (i *Images) ContainerImage(_ context.Context, id string) (ctrdimage.Image, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	im, ok := i.containers[id]
	if !ok {
		return ctrdimage.Image{}, fmt.Errorf("container %s has no image: %w", id, ctrdimage.ErrNotImage)
	}
	return im, nil
}

// HasBlob reports whether the blob is stored.
func (i *Images) HasBlob(_ context.Context, d digest.Digest) (bool, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	_, ok := i.blobs[d]
	return ok, nil
}

// OpenBlob reads a stored blob.
func (i *Images) OpenBlob(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	data, ok := i.blobs[desc.Digest]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, errdefs.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}

// Close counts the close of an OpenImages.
func (i *Images) Close() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.closed++
	return nil
}

// Containerd returns the images the host serves.
func (h *Host) Containerd() *Images {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.images
}

// OpenImages returns the images the host serves.
func (h *Host) OpenImages(context.Context) (*Images, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failures["OpenImages"]; err != nil {
		return nil, err
	}
	h.images.mu.Lock()
	h.images.opened++
	h.images.mu.Unlock()
	return h.images, nil
}

// ConvertLayer writes the blob as the disk and reports its digest as the
// diff ID, counting conversions.
func (h *Host) ConvertLayer(_ context.Context, blob io.Reader, _ string, out io.ReadWriteSeeker) (layers.Info, error) {
	h.mu.Lock()
	err := h.failures["ConvertLayer"]
	h.conversions++
	h.mu.Unlock()
	if err != nil {
		return layers.Info{}, err
	}
	data, err := io.ReadAll(blob)
	if err != nil {
		return layers.Info{}, err
	}
	if _, err := out.Write(data); err != nil {
		return layers.Info{}, err
	}
	d := digest.FromBytes(data)
	return layers.Info{DiffID: d, RootHash: d.Encoded(), DataBlocks: 1, Size: int64(len(data))}, nil
}

// Conversions counts ConvertLayer's calls.
func (h *Host) Conversions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conversions
}
