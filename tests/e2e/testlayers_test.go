package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/measurements/layer"
	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

// testImageLayers is the layers entry of a rule running the test image
// (and the pause image made from it, which has the same layer): what
// `c8s-measure image` prints for it, here computed by measurements/layer
// from the image's layer blob, as the owner would from the image it
// ships.
var testImageLayers = sync.OnceValue(func() string {
	var buf bytes.Buffer
	if err := ociimage.Write(&buf, ociimage.Options{Name: image}); err != nil {
		panic(fmt.Sprintf("build the test image: %v", err))
	}
	blobs := map[string][]byte{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			panic(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			panic(err)
		}
		blobs[h.Name] = data
	}
	blob := func(d digest.Digest) []byte { return blobs["blobs/sha256/"+d.Encoded()] }
	var index ocispec.Index
	var m ocispec.Manifest
	if err := json.Unmarshal(blobs[ocispec.ImageIndexFile], &index); err != nil || len(index.Manifests) != 1 {
		panic(fmt.Sprintf("the test image's index: %v", err))
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &m); err != nil {
		panic(fmt.Sprintf("the test image's manifest: %v", err))
	}
	var entries []string
	for _, l := range m.Layers {
		r, err := layer.Decompress(bytes.NewReader(blob(l.Digest)), l.MediaType)
		if err != nil {
			panic(err)
		}
		f, err := os.CreateTemp("", "c8s-e2e-layer-")
		if err != nil {
			panic(err)
		}
		info, err := layer.Build(r, f)
		f.Close()
		os.Remove(f.Name())
		if err != nil {
			panic(fmt.Sprintf("measure the test image's layer %s: %v", l.Digest, err))
		}
		entries = append(entries, fmt.Sprintf("{ digest = %q, verity = %q, blocks = %d }", info.DiffID, info.RootHash, info.DataBlocks))
	}
	return "layers = [" + strings.Join(entries, ", ") + "]\n"
})
