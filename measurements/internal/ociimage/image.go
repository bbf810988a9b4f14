// Package ociimage reads a container image's manifest, config and layers
// for c8s-measure (`c8s-measure image`, `c8s-measure policy`): from an OCI
// image layout (a directory or a tar of one), from containerd's content
// store, or from a registry. Each source only fetches blobs; resolving the
// linux/amd64 manifest and checking every blob against its digest and
// size happen here, once, for all of them.
package ociimage

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	_ "crypto/sha256" // registers sha256 for go-digest
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Media types of indexes and manifests, OCI's and Docker's.
const (
	MediaTypeDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
	MediaTypeDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
)

// maxJSON bounds the JSON blobs (indexes, manifests, configs) read.
const maxJSON = 8 << 20

// blobSource fetches the blob a descriptor names (its media type says
// whether a registry serves it as a manifest). Its reader need not check
// the digest: Image does.
type blobSource interface {
	blob(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error)
}

// Image is a linux/amd64 image: its manifest, config and layers.
type Image struct {
	// Source names where it was read, for messages.
	Source string
	// Digests are those of the index and manifest that lead to the
	// manifest, outermost first; the last is the manifest's.
	Digests []digest.Digest
	// Manifest is the image manifest; ConfigFile its config blob, decoded.
	Manifest   ocispec.Manifest
	ConfigFile ocispec.Image
	src        blobSource
}

// ManifestDigest is the digest of the image's manifest.
func (img *Image) ManifestDigest() digest.Digest { return img.Digests[len(img.Digests)-1] }

// OpenLayer opens layer i's blob as the manifest lists it (compressed as
// its media type says). The reader fails at its end, naming the layer,
// unless the blob has the manifest's digest and size: read it to the end.
func (img *Image) OpenLayer(ctx context.Context, i int) (io.ReadCloser, error) {
	d := img.Manifest.Layers[i]
	r, err := img.src.blob(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", d.Digest, err)
	}
	return verified(r, d), nil
}

// verifyingReader checks a blob's digest and size at its end.
type verifyingReader struct {
	r    io.ReadCloser
	desc ocispec.Descriptor
	v    digest.Verifier
	n    int64
}

func verified(r io.ReadCloser, desc ocispec.Descriptor) io.ReadCloser {
	return &verifyingReader{r: r, desc: desc, v: desc.Digest.Verifier()}
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.n += int64(n)
	_, _ = v.v.Write(p[:n])
	if v.desc.Size > 0 && v.n > v.desc.Size {
		return n, fmt.Errorf("blob %s is larger than the %d bytes its descriptor says", v.desc.Digest, v.desc.Size)
	}
	if err == io.EOF {
		if v.desc.Size > 0 && v.n != v.desc.Size {
			return n, fmt.Errorf("blob %s is %d bytes, its descriptor says %d", v.desc.Digest, v.n, v.desc.Size)
		}
		if !v.v.Verified() {
			return n, fmt.Errorf("blob %s does not have its digest: the source changed or corrupted it", v.desc.Digest)
		}
	}
	return n, err
}

func (v *verifyingReader) Close() error { return v.r.Close() }

// readJSON reads the JSON blob desc names, checks its digest and size,
// and decodes it into v.
func readJSON(ctx context.Context, src blobSource, desc ocispec.Descriptor, v any) error {
	if err := desc.Digest.Validate(); err != nil {
		return fmt.Errorf("digest %q: %w", desc.Digest, err)
	}
	if desc.Size > maxJSON {
		return fmt.Errorf("blob %s: %d bytes is larger than the %d a manifest or config may have", desc.Digest, desc.Size, maxJSON)
	}
	r, err := src.blob(ctx, desc)
	if err != nil {
		return err
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(verified(r, desc), maxJSON+1))
	if err != nil {
		return err
	}
	if len(data) > maxJSON {
		return fmt.Errorf("blob %s is larger than %d bytes", desc.Digest, maxJSON)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	return nil
}

// candidate is a manifest an index leads to.
type candidate struct {
	chain []digest.Digest
	names []string // the names a layout's index annotates it with
	desc  ocispec.Descriptor
}

// isIndex and isManifest sort descriptors by media type.
func isIndex(mt string) bool { return mt == ocispec.MediaTypeImageIndex || mt == MediaTypeDockerList }
func isManifest(mt string) bool {
	return mt == ocispec.MediaTypeImageManifest || mt == MediaTypeDockerManifest
}

// candidates walks descs (an index's entries) down to the linux/amd64
// manifests; top names the descriptors' names at the top level (a
// layout's index annotations), nil below.
func candidates(ctx context.Context, src blobSource, descs []ocispec.Descriptor, chain []digest.Digest, names []string, top bool, depth int) ([]candidate, error) {
	var out []candidate
	for _, d := range descs {
		n := names
		if top {
			n = []string{d.Annotations["io.containerd.image.name"], d.Annotations[ocispec.AnnotationRefName]}
		}
		if p := d.Platform; p != nil && (p.OS != "linux" || p.Architecture != "amd64") {
			continue // another platform, or an attestation ("unknown")
		}
		c := append(slices.Clone(chain), d.Digest)
		switch {
		case isIndex(d.MediaType):
			if depth > 4 {
				return nil, errors.New("indexes nested too deep")
			}
			var sub ocispec.Index
			if err := readJSON(ctx, src, d, &sub); err != nil {
				return nil, err
			}
			more, err := candidates(ctx, src, sub.Manifests, c, n, false, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		case isManifest(d.MediaType):
			out = append(out, candidate{chain: c, names: n, desc: d})
		}
	}
	return out, nil
}

// load reads the manifest and config of candidate c.
func load(ctx context.Context, src blobSource, source string, c candidate) (*Image, error) {
	img := &Image{Source: source, Digests: c.chain, src: src}
	if err := readJSON(ctx, src, c.desc, &img.Manifest); err != nil {
		return nil, err
	}
	if img.Manifest.Config.Digest == "" {
		return nil, fmt.Errorf("manifest %s names no config", c.desc.Digest)
	}
	if err := readJSON(ctx, src, img.Manifest.Config, &img.ConfigFile); err != nil {
		return nil, err
	}
	if n, m := len(img.ConfigFile.RootFS.DiffIDs), len(img.Manifest.Layers); n != m {
		return nil, fmt.Errorf("manifest %s has %d layers, its config's rootfs.diff_ids %d", c.desc.Digest, m, n)
	}
	return img, nil
}

// fromDescriptor resolves desc (an index or a manifest) to its linux/amd64
// image.
func fromDescriptor(ctx context.Context, src blobSource, source string, desc ocispec.Descriptor) (*Image, error) {
	cands, err := candidates(ctx, src, []ocispec.Descriptor{desc}, nil, nil, false, 0)
	if err != nil {
		return nil, err
	}
	switch len(cands) {
	case 0:
		return nil, fmt.Errorf("%s: no linux/amd64 image manifest", desc.Digest)
	case 1:
		return load(ctx, src, source, cands[0])
	}
	return nil, fmt.Errorf("%s: %d linux/amd64 manifests (%s): name one by its digest", desc.Digest, len(cands), candidateList(cands))
}

// sniffMediaType is the media type a manifest or index states, for
// sources that do not say (a content store).
func sniffMediaType(data []byte) string {
	var probe struct {
		MediaType string            `json:"mediaType"`
		Manifests []json.RawMessage `json:"manifests"`
		Layers    []json.RawMessage `json:"layers"`
		Config    struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	if json.Unmarshal(data, &probe) != nil {
		return ""
	}
	switch {
	case probe.MediaType != "":
		return probe.MediaType
	case probe.Manifests != nil:
		return ocispec.MediaTypeImageIndex
	case probe.Layers != nil && probe.Config.Digest != "":
		return ocispec.MediaTypeImageManifest
	}
	return ""
}

func candidateList(cs []candidate) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = digestList(c.chain)
	}
	return strings.Join(s, ", ")
}

func digestList(ds []digest.Digest) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, " → ")
}

// decompress sniffs gzip (and refuses zstd) compression of a layout
// archive.
func decompress(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		return gzip.NewReader(br)
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return nil, errors.New("a zstd-compressed layout archive is not read: decompress it, or give the layout's directory")
	}
	return br, nil
}
