package ociimage

import (
	"context"
	"fmt"
	"io"
	"os"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/measurements/layer"
)

// Layer is one layer of an image as a policy pins it: the blob the
// manifest lists and the layer disk it converts to.
type Layer struct {
	// Blob is the manifest's descriptor: compressed digest, media type,
	// size.
	Blob ocispec.Descriptor
	// Disk is the layer disk: diff ID, dm-verity root, data blocks, size.
	Disk layer.Info
}

// MeasureLayers converts each layer of img, bottom first, into its layer
// disk (measurements/layer) in a temporary file under tmpDir ("" for the
// system's), removed afterwards, and returns what a policy pins. It reads
// every layer blob, checking its digest and size, and refuses a layer
// whose diff ID is not the one the image config lists.
func MeasureLayers(ctx context.Context, img *Image, tmpDir string) ([]Layer, error) {
	out := make([]Layer, 0, len(img.Manifest.Layers))
	for i, desc := range img.Manifest.Layers {
		info, err := measureLayer(ctx, img, i, tmpDir)
		if err != nil {
			return nil, fmt.Errorf("layer %d (%s): %w", i+1, desc.Digest, err)
		}
		if want := img.ConfigFile.RootFS.DiffIDs[i]; info.DiffID != want {
			return nil, fmt.Errorf("layer %d (%s): its diff ID is %s, the image config lists %s: the blob is not the layer the image was built with", i+1, desc.Digest, info.DiffID, want)
		}
		out = append(out, Layer{Blob: desc, Disk: info})
	}
	return out, nil
}

func measureLayer(ctx context.Context, img *Image, i int, tmpDir string) (layer.Info, error) {
	blob, err := img.OpenLayer(ctx, i)
	if err != nil {
		return layer.Info{}, err
	}
	defer blob.Close()
	tr, err := layer.Decompress(blob, img.Manifest.Layers[i].MediaType)
	if err != nil {
		return layer.Info{}, err
	}
	defer tr.Close()
	f, err := os.CreateTemp(tmpDir, "c8s-layer-*.img")
	if err != nil {
		return layer.Info{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	info, err := layer.Build(tr, f)
	if err != nil {
		return layer.Info{}, err
	}
	// A compressed stream may end before the blob does (gzip reads its
	// trailer, not what follows): the blob's digest covers it all.
	if _, err := io.Copy(io.Discard, blob); err != nil {
		return layer.Info{}, err
	}
	return info, nil
}
