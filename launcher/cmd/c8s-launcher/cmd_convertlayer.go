package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/c8s-dev/c8s/measurements/layer"
)

func init() {
	register("convert-layer", "(run by the shim) write the layer disk of a layer blob read on stdin to fd 3", runConvertLayer)
}

// convertedLayer is convert-layer's answer on stdout; the shim's
// shim/layers decodes it.
type convertedLayer struct {
	DiffID     string `json:"diff_id"`
	RootHash   string `json:"root_hash"`
	DataBlocks uint64 `json:"data_blocks"`
	Size       int64  `json:"size"`
}

// runConvertLayer is the shim's short-lived layer converter: the blob on
// stdin, decompressed by --media-type, is written by measurements/layer
// as a layer disk into the empty file the shim passes as fd 3, and the
// disk's diff ID, dm-verity root and sizes are printed as JSON. The shim
// runs the conversion here rather than in itself so that the tar, ext4,
// zstd and dm-verity code is never resident in a pod's shim.
func runConvertLayer(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("convert-layer")
	mediaType := fs.String("media-type", "", "the blob's OCI media type (tar, tar+gzip, tar+zstd)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *mediaType == "" || fs.NArg() != 0 {
		return errors.New("usage: c8s-launcher convert-layer --media-type TYPE <blob 3>disk")
	}
	out := os.NewFile(3, "layer-disk")
	if out == nil {
		return errors.New("convert-layer: fd 3 (the layer disk to write) is not open")
	}
	defer out.Close()
	if _, err := out.Stat(); err != nil {
		return fmt.Errorf("convert-layer: fd 3 (the layer disk to write): %w", err)
	}
	tr, err := layer.Decompress(os.Stdin, *mediaType)
	if err != nil {
		return err
	}
	defer tr.Close()
	info, err := layer.Build(tr, out)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(convertedLayer{
		DiffID: info.DiffID.String(), RootHash: info.RootHash, DataBlocks: info.DataBlocks, Size: info.Size,
	})
}
