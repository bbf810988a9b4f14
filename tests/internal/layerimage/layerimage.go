// Package layerimage writes OCI image layout tarballs of several layers,
// for the tests and benchmarks of layer mode: the busybox layer of
// tests/internal/ociimage at the bottom (so that its diff ID is the
// busybox test image's), then layers the caller describes, each gzip
// compressed. A layer may hold large pseudo-random files (a fixed seed
// per file: equal options give byte-identical output); those layers are
// streamed through files in a scratch directory, not memory.
//
// The tarball can be imported with `ctr images import` and pushed to a
// registry with `ctr images push`.
package layerimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"runtime"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

// Entry is one entry of a layer.
type Entry struct {
	// Name is the path in the layer ("etc/app/config").
	Name string
	// Dir makes a directory; Mode is its mode or the file's (default
	// 0755 and 0644).
	Dir  bool
	Mode int64
	// Data is a file's content, or, with Random set, Random bytes of
	// pseudo-random content seeded by Name.
	Data   []byte
	Random int64
	// Whiteout deletes Name of the layers below (an OCI .wh. entry).
	Whiteout bool
}

// Options describe the image.
type Options struct {
	// Name is the full reference the image is imported as.
	Name string
	// Cmd is the image's default command (empty: ["sh"]).
	Cmd []string
	// Layers are the layers above the busybox layer, bottom first.
	Layers [][]Entry
	// ScratchDir holds the layers while they are written (default: the
	// system's temporary directory).
	ScratchDir string
}

// Layer describes one layer of a written image.
type Layer struct {
	// DiffID is the digest of the uncompressed tar; Blob the gzip blob's.
	DiffID digest.Digest
	Blob   digest.Digest
	Size   int64
	// Tar is the uncompressed tar, for layers without Random entries
	// (the busybox layer's too).
	Tar []byte
}

// Image is what WriteFile wrote.
type Image struct {
	Manifest digest.Digest
	Layers   []Layer
}

// mtime is every entry's modification time.
var mtime = time.Unix(0, 0)

// WriteFile writes the image layout tarball of o to path.
func WriteFile(path string, o Options) (Image, error) {
	if len(o.Cmd) == 0 {
		o.Cmd = []string{"sh"}
	}
	base, baseTar, err := busyboxLayer(o.Name)
	if err != nil {
		return Image{}, err
	}
	scratch, err := os.MkdirTemp(o.ScratchDir, "layerimage-")
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(scratch)

	img := Image{Layers: []Layer{{DiffID: digest.FromBytes(baseTar), Blob: digest.FromBytes(base), Size: int64(len(base)), Tar: baseTar}}}
	blobs := []blobFile{{data: base}}
	for i, entries := range o.Layers {
		l, bf, err := writeLayer(scratch, i, entries)
		if err != nil {
			return Image{}, err
		}
		img.Layers = append(img.Layers, l)
		blobs = append(blobs, bf)
	}
	created := mtime.UTC()
	diffIDs := make([]digest.Digest, len(img.Layers))
	layerDescs := make([]ocispec.Descriptor, len(img.Layers))
	for i, l := range img.Layers {
		diffIDs[i] = l.DiffID
		layerDescs[i] = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: l.Blob, Size: l.Size}
	}
	platform := ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"}
	config, err := json.Marshal(ocispec.Image{
		Created:  &created,
		Platform: platform,
		Config:   ocispec.ImageConfig{Env: ociimage.Env, Cmd: o.Cmd},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
	})
	if err != nil {
		return Image{}, err
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(config), Size: int64(len(config))},
		Layers:    layerDescs,
	})
	if err != nil {
		return Image{}, err
	}
	img.Manifest = digest.FromBytes(manifest)
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{
			MediaType: ocispec.MediaTypeImageManifest, Digest: img.Manifest, Size: int64(len(manifest)), Platform: &platform,
			Annotations: map[string]string{ocispec.AnnotationRefName: "latest", ociimage.AnnotationImageName: o.Name},
		}},
	})
	if err != nil {
		return Image{}, err
	}
	layout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return Image{}, err
	}
	blobs = append(blobs, blobFile{data: config}, blobFile{data: manifest})

	f, err := os.Create(path)
	if err != nil {
		return Image{}, err
	}
	tw := tar.NewWriter(f)
	put := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	err = func() error {
		for _, d := range []string{"blobs/", "blobs/sha256/"} {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		seen := map[digest.Digest]bool{}
		for _, b := range blobs {
			r, size, d, err := b.open()
			if err != nil {
				return err
			}
			if !seen[d] {
				err = put("blobs/sha256/"+d.Encoded(), size, r)
			}
			seen[d] = true
			if c, ok := r.(io.Closer); ok {
				c.Close()
			}
			if err != nil {
				return err
			}
		}
		if err := put(ocispec.ImageLayoutFile, int64(len(layout)), bytes.NewReader(layout)); err != nil {
			return err
		}
		if err := put(ocispec.ImageIndexFile, int64(len(index)), bytes.NewReader(index)); err != nil {
			return err
		}
		return tw.Close()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return Image{}, fmt.Errorf("write %s: %w", path, err)
	}
	return img, nil
}

// blobFile is a blob in memory or in a scratch file.
type blobFile struct {
	data []byte
	path string
	d    digest.Digest
	size int64
}

func (b blobFile) open() (io.Reader, int64, digest.Digest, error) {
	if b.path == "" {
		return bytes.NewReader(b.data), int64(len(b.data)), digest.FromBytes(b.data), nil
	}
	f, err := os.Open(b.path)
	return f, b.size, b.d, err
}

// busyboxLayer returns the gzip blob and the tar of ociimage's busybox
// layer, taken from the image ociimage writes.
func busyboxLayer(name string) (blob, tarData []byte, err error) {
	var buf bytes.Buffer
	if err := ociimage.Write(&buf, ociimage.Options{Name: name}); err != nil {
		return nil, nil, err
	}
	files := map[string][]byte{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, nil, err
		}
		files[h.Name] = data
	}
	var idx ocispec.Index
	if err := json.Unmarshal(files[ocispec.ImageIndexFile], &idx); err != nil || len(idx.Manifests) != 1 {
		return nil, nil, fmt.Errorf("busybox image index: %v", err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(files["blobs/sha256/"+idx.Manifests[0].Digest.Encoded()], &m); err != nil || len(m.Layers) != 1 {
		return nil, nil, fmt.Errorf("busybox image manifest: %v", err)
	}
	blob = files["blobs/sha256/"+m.Layers[0].Digest.Encoded()]
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return nil, nil, err
	}
	tarData, err = io.ReadAll(zr)
	return blob, tarData, err
}

// writeLayer writes layer i's tar and gzip blob into scratch, hashing
// both as they are written.
func writeLayer(scratch string, i int, entries []Entry) (Layer, blobFile, error) {
	blobPath := fmt.Sprintf("%s/layer%d.tar.gz", scratch, i)
	f, err := os.Create(blobPath)
	if err != nil {
		return Layer{}, blobFile{}, err
	}
	defer f.Close()
	blobHash := sha256.New()
	zw, err := gzip.NewWriterLevel(io.MultiWriter(f, blobHash), gzip.BestSpeed)
	if err != nil {
		return Layer{}, blobFile{}, err
	}
	tarHash := sha256.New()
	small := true
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(io.MultiWriter(zw, tarHash, &limited{&tarBuf, &small}))
	for _, e := range entries {
		if err := writeEntry(tw, e); err != nil {
			return Layer{}, blobFile{}, fmt.Errorf("layer %d, %s: %w", i, e.Name, err)
		}
		if e.Random > 0 {
			small = false
		}
	}
	if err := tw.Close(); err != nil {
		return Layer{}, blobFile{}, err
	}
	if err := zw.Close(); err != nil {
		return Layer{}, blobFile{}, err
	}
	st, err := f.Stat()
	if err != nil {
		return Layer{}, blobFile{}, err
	}
	l := Layer{DiffID: digest.NewDigest(digest.SHA256, tarHash), Blob: digest.NewDigest(digest.SHA256, blobHash), Size: st.Size()}
	if small {
		l.Tar = tarBuf.Bytes()
	}
	return l, blobFile{path: blobPath, d: l.Blob, size: l.Size}, nil
}

// limited keeps what is written while *keep holds (layers without large
// files).
type limited struct {
	buf  *bytes.Buffer
	keep *bool
}

func (l *limited) Write(p []byte) (int, error) {
	if *l.keep {
		l.buf.Write(p)
	}
	return len(p), nil
}

func writeEntry(tw *tar.Writer, e Entry) error {
	h := &tar.Header{Name: e.Name, Mode: e.Mode, ModTime: mtime, Format: tar.FormatPAX}
	switch {
	case e.Whiteout:
		h.Typeflag, h.Name, h.Mode = tar.TypeReg, path.Join(path.Dir(e.Name), ".wh."+path.Base(e.Name)), 0o644
		return tw.WriteHeader(h)
	case e.Dir:
		h.Typeflag, h.Name = tar.TypeDir, e.Name+"/"
		if h.Mode == 0 {
			h.Mode = 0o755
		}
		return tw.WriteHeader(h)
	}
	h.Typeflag = tar.TypeReg
	if h.Mode == 0 {
		h.Mode = 0o644
	}
	if e.Random == 0 {
		h.Size = int64(len(e.Data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(e.Data)
		return err
	}
	h.Size = e.Random
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	seed := fnv.New64a()
	seed.Write([]byte(e.Name))
	var key [32]byte
	copy(key[:], seed.Sum(nil))
	_, err := io.CopyN(tw, rand.NewChaCha8(key), e.Random)
	return err
}
