// Package ocilayout writes small, deterministic OCI image layouts for the
// tests of the policy generator (measurements/policygen), the image
// readers (measurements/internal/ociimage) and their CLI: an image config
// and layers of given files. StartRegistry and Push put them in a local
// registry for the tests that read one.
package ocilayout

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // registers sha256 for go-digest
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Image is one image of a layout.
type Image struct {
	// Name is annotated on its index entry (io.containerd.image.name).
	Name   string
	Config ocispec.ImageConfig
	// Layers are the files of each layer, path → content; a path ending
	// in a whiteout name (etc/.wh.passwd) deletes the file below.
	Layers []map[string]string
	// MultiPlatform wraps the manifest in an image index, beside an
	// arm64 manifest with another config.
	MultiPlatform bool
	// Compression of the layer blobs: "" (gzip), "zstd" or "none".
	Compression string
}

// Write writes a layout of imgs to dir and returns the digest of each
// image's entry in index.json (its manifest's, or its index's).
func Write(dir string, imgs ...Image) ([]digest.Digest, error) {
	blobs := map[digest.Digest][]byte{}
	blob := func(media string, data []byte) ocispec.Descriptor {
		d := digest.FromBytes(data)
		blobs[d] = data
		return ocispec.Descriptor{MediaType: media, Digest: d, Size: int64(len(data))}
	}
	manifest := func(cfg ocispec.ImageConfig, arch string, layers []map[string]string, compression string) (ocispec.Descriptor, error) {
		var descs []ocispec.Descriptor
		var diffs []digest.Digest
		for _, files := range layers {
			raw, gz, err := layer(files)
			if err != nil {
				return ocispec.Descriptor{}, err
			}
			switch compression {
			case "":
				descs = append(descs, blob(ocispec.MediaTypeImageLayerGzip, gz))
			case "none":
				descs = append(descs, blob(ocispec.MediaTypeImageLayer, raw))
			case "zstd":
				zw, err := zstd.NewWriter(nil)
				if err != nil {
					return ocispec.Descriptor{}, err
				}
				descs = append(descs, blob(ocispec.MediaTypeImageLayerZstd, zw.EncodeAll(raw, nil)))
			default:
				return ocispec.Descriptor{}, fmt.Errorf("compression %q", compression)
			}
			diffs = append(diffs, digest.FromBytes(raw))
		}
		c, err := json.Marshal(ocispec.Image{
			Platform: ocispec.Platform{Architecture: arch, OS: "linux"},
			Config:   cfg,
			RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffs},
		})
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		m, err := json.Marshal(ocispec.Manifest{
			Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
			Config: blob(ocispec.MediaTypeImageConfig, c), Layers: descs,
		})
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		d := blob(ocispec.MediaTypeImageManifest, m)
		d.Platform = &ocispec.Platform{Architecture: arch, OS: "linux"}
		return d, nil
	}
	var top []ocispec.Descriptor
	for _, img := range imgs {
		d, err := manifest(img.Config, "amd64", img.Layers, img.Compression)
		if err != nil {
			return nil, err
		}
		if img.MultiPlatform {
			other, err := manifest(ocispec.ImageConfig{Cmd: []string{"/other-platform"}}, "arm64", nil, "")
			if err != nil {
				return nil, err
			}
			idx, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{other, d}})
			if err != nil {
				return nil, err
			}
			d = blob(ocispec.MediaTypeImageIndex, idx)
		}
		d.Platform = nil
		d.Annotations = map[string]string{"io.containerd.image.name": img.Name}
		top = append(top, d)
	}
	idx, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: top})
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o755); err != nil {
		return nil, err
	}
	for _, d := range slices.Sorted(maps.Keys(blobs)) {
		if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", d.Encoded()), blobs[d], 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, ocispec.ImageLayoutFile), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ocispec.ImageIndexFile), idx, 0o644); err != nil {
		return nil, err
	}
	digests := make([]digest.Digest, len(top))
	for i, d := range top {
		digests[i] = d.Digest
	}
	return digests, nil
}

// layer returns a layer of files, raw and gzip-compressed.
func layer(files map[string]string) (raw, gz []byte, err error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name])), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(h); err != nil {
			return nil, nil, err
		}
		if _, err := tw.Write([]byte(files[name])); err != nil {
			return nil, nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, nil, err
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	if _, err := zw.Write(b.Bytes()); err != nil {
		return nil, nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, nil, err
	}
	return b.Bytes(), z.Bytes(), nil
}

// WriteTar writes the layout in dir as a gzip-compressed tar archive at
// path, its entries prefixed "./" as `tar -C dir .` writes them.
func WriteTar(path, dir string) error {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: "./" + filepath.ToSlash(rel), Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
