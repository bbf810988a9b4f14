// Package ctrdimage reads container images from containerd, as layer
// mode needs them: a container's image resolved for the node's platform
// to its layers (diff ID and compressed blob each), the layer blobs
// themselves, and the diff IDs of every image the node keeps, for the
// layer cache's garbage collection. ImageFS counts the layer cache in
// the image file system CRI reports to kubelet (ImageFsInfo).
//
// It speaks containerd's gRPC API (containers, images, content,
// snapshots, namespaces, leases, introspection, and CRI's ImageFsInfo)
// with the generated clients alone, not containerd's client package,
// which would weigh on the shim's memory.
package ctrdimage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Docker's media types, which containerd stores as pulled.
const (
	mediaTypeDockerManifest     = "application/vnd.docker.distribution.manifest.v2+json"
	mediaTypeDockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
	mediaTypeDockerConfig       = "application/vnd.docker.container.image.v1+json"
	// maxMetadata bounds an index, manifest or config read into memory.
	maxMetadata = 4 << 20
)

// ErrNotImage says a container's root is not (only) its image: it has no
// image, the image is gone, or its snapshot is not the image's.
var ErrNotImage = errors.New("the container's root file system is not an image of containerd's")

// Layer is one layer of an image.
type Layer struct {
	// DiffID is the digest of the layer's uncompressed tar, as the image
	// config's rootfs.diff_ids lists it.
	DiffID digest.Digest
	// Blob is the layer as the manifest lists it (compressed, usually).
	Blob ocispec.Descriptor
}

// Image is an image resolved for one platform.
type Image struct {
	// Name is the image's name in containerd.
	Name string
	// Manifest and Config are the digests of the platform's manifest and
	// its config.
	Manifest digest.Digest
	Config   digest.Digest
	// Layers are bottom first.
	Layers []Layer
}

// ChainID is the snapshot name containerd unpacks the image's top layer
// as.
func (im Image) ChainID() digest.Digest {
	ids := make([]digest.Digest, len(im.Layers))
	for i, l := range im.Layers {
		ids[i] = l.DiffID
	}
	return identity.ChainID(ids)
}

// Blobs reads small blobs (indexes, manifests, configs).
type Blobs interface {
	ReadBlob(ctx context.Context, desc ocispec.Descriptor) ([]byte, error)
}

// Platform is the node's: the platform the images are resolved for.
var Platform = ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}

// Resolve walks from an image's target (an index or a manifest) to the
// manifest for Platform and its layers.
func Resolve(ctx context.Context, b Blobs, name string, target ocispec.Descriptor) (Image, error) {
	desc := target
	for depth := 0; ; depth++ {
		if depth > 4 {
			return Image{}, fmt.Errorf("image %s: indexes nested too deep", name)
		}
		switch desc.MediaType {
		case ocispec.MediaTypeImageIndex, mediaTypeDockerManifestList:
			data, err := readJSON(ctx, b, desc)
			if err != nil {
				return Image{}, fmt.Errorf("image %s: %w", name, err)
			}
			var idx ocispec.Index
			if err := json.Unmarshal(data, &idx); err != nil {
				return Image{}, fmt.Errorf("image %s: index %s: %w", name, desc.Digest, err)
			}
			next, ok := pick(idx.Manifests)
			if !ok {
				return Image{}, fmt.Errorf("image %s has no manifest for %s/%s", name, Platform.OS, Platform.Architecture)
			}
			desc = next
		case ocispec.MediaTypeImageManifest, mediaTypeDockerManifest:
			return manifestImage(ctx, b, name, desc)
		default:
			return Image{}, fmt.Errorf("image %s: %s has media type %q, not an image index or manifest", name, desc.Digest, desc.MediaType)
		}
	}
}

// pick returns the index entry for Platform: an exact os/architecture
// match, or the only entry when it names no platform.
func pick(ms []ocispec.Descriptor) (ocispec.Descriptor, bool) {
	for _, m := range ms {
		if p := m.Platform; p != nil && p.OS == Platform.OS && p.Architecture == Platform.Architecture {
			return m, true
		}
	}
	if len(ms) == 1 && ms[0].Platform == nil {
		return ms[0], true
	}
	return ocispec.Descriptor{}, false
}

func manifestImage(ctx context.Context, b Blobs, name string, desc ocispec.Descriptor) (Image, error) {
	data, err := readJSON(ctx, b, desc)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return Image{}, fmt.Errorf("image %s: manifest %s: %w", name, desc.Digest, err)
	}
	if m.Config.MediaType != ocispec.MediaTypeImageConfig && m.Config.MediaType != mediaTypeDockerConfig {
		return Image{}, fmt.Errorf("image %s: manifest %s has a config of media type %q, not a container image's", name, desc.Digest, m.Config.MediaType)
	}
	cdata, err := readJSON(ctx, b, m.Config)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(cdata, &cfg); err != nil {
		return Image{}, fmt.Errorf("image %s: config %s: %w", name, m.Config.Digest, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return Image{}, fmt.Errorf("image %s: manifest %s lists %d layers but its config %d diff IDs", name, desc.Digest, len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	im := Image{Name: name, Manifest: desc.Digest, Config: m.Config.Digest}
	for i, l := range m.Layers {
		d := cfg.RootFS.DiffIDs[i]
		if err := d.Validate(); err != nil || d.Algorithm() != digest.SHA256 {
			return Image{}, fmt.Errorf("image %s: diff ID %d %q is not a sha256 digest", name, i, d)
		}
		im.Layers = append(im.Layers, Layer{DiffID: d, Blob: l})
	}
	return im, nil
}

// readJSON reads a small blob and checks its digest.
func readJSON(ctx context.Context, b Blobs, desc ocispec.Descriptor) ([]byte, error) {
	if desc.Size > maxMetadata {
		return nil, fmt.Errorf("%s %s is %d bytes, more than the %d an index, manifest or config may have", desc.MediaType, desc.Digest, desc.Size, maxMetadata)
	}
	data, err := b.ReadBlob(ctx, desc)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", desc.Digest, err)
	}
	if err := desc.Digest.Validate(); err != nil {
		return nil, err
	}
	if got := desc.Digest.Algorithm().FromBytes(data); got != desc.Digest {
		return nil, fmt.Errorf("blob %s: content store returned bytes of digest %s", desc.Digest, got)
	}
	return data, nil
}
