package ociimage

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// OpenLayout reads the image ref from an OCI image layout at p: a
// directory (skopeo copy docker://REF oci:DIR, or the directory of an
// unpacked `docker save` or `ctr images export`) or a tar archive of one,
// optionally gzip-compressed. A layout holding several images is searched
// for ref by the names its index annotates (io.containerd.image.name,
// org.opencontainers.image.ref.name); a multi-platform image gives its
// linux/amd64 manifest. A ref pinned by digest must name the layout's
// index or manifest.
func OpenLayout(ctx context.Context, p, ref string) (*Image, error) {
	st, err := openStore(p)
	if err != nil {
		return nil, err
	}
	img, err := loadLayout(ctx, st, p, ref)
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", p, err)
	}
	return img, nil
}

// store reads the files of an image layout.
type store interface {
	// open opens the file called name (slash-separated, relative).
	open(name string) (io.ReadCloser, error)
}

// layoutBlobs fetches a layout's blobs.
type layoutBlobs struct{ st store }

func (l layoutBlobs) blob(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	name, err := blobName(desc.Digest)
	if err != nil {
		return nil, err
	}
	return l.st.open(name)
}

// blobName is the layout path of a blob, refusing digests that are not.
func blobName(d digest.Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", fmt.Errorf("digest %q: %w", d, err)
	}
	return "blobs/" + d.Algorithm().String() + "/" + d.Encoded(), nil
}

type dirStore string

func (d dirStore) open(name string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(string(d), filepath.FromSlash(name)))
}

// tarStore reads a layout from a tar archive: each open scans it.
type tarStore string

func (t tarStore) open(name string) (io.ReadCloser, error) {
	f, err := os.Open(string(t))
	if err != nil {
		return nil, err
	}
	r, err := decompress(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			f.Close()
			return nil, fmt.Errorf("%s: %w", name, os.ErrNotExist)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("read %s: %w", string(t), err)
		}
		if path.Clean(strings.TrimPrefix(h.Name, "./")) == name && h.Typeflag == tar.TypeReg {
			return readCloser{tr, f}, nil
		}
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

func openStore(p string) (store, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return dirStore(p), nil
	}
	return tarStore(p), nil
}

func loadLayout(ctx context.Context, st store, source, ref string) (*Image, error) {
	f, err := st.open(ocispec.ImageIndexFile)
	if err != nil {
		return nil, fmt.Errorf("not an OCI image layout (%w)", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxJSON+1))
	f.Close()
	if err != nil {
		return nil, err
	}
	var idx ocispec.Index
	if len(data) > maxJSON {
		return nil, fmt.Errorf("%s is larger than %d bytes", ocispec.ImageIndexFile, maxJSON)
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, fmt.Errorf("not an OCI image layout (%s: %w)", ocispec.ImageIndexFile, err)
	}
	src := layoutBlobs{st}
	cands, err := candidates(ctx, src, idx.Manifests, nil, nil, true, 0)
	if err != nil {
		return nil, err
	}
	c, err := pick(cands, ref)
	if err != nil {
		return nil, err
	}
	if pin := PinnedDigest(ref); pin != "" && !slices.Contains(c.chain, pin) {
		return nil, fmt.Errorf("the image pins %s, but the layout's image is %s: the layout holds another image", pin, digestList(c.chain))
	}
	return load(ctx, src, source, c)
}

// pick chooses the manifest of ref among the layout's.
func pick(cands []candidate, ref string) (candidate, error) {
	if len(cands) == 0 {
		return candidate{}, errors.New("no linux/amd64 image manifest in the layout")
	}
	if len(cands) == 1 {
		return cands[0], nil
	}
	bare := strings.SplitN(ref, "@", 2)[0]
	tag := ""
	if i := strings.LastIndex(bare, ":"); i > strings.LastIndex(bare, "/") {
		tag = bare[i+1:]
	}
	var named []candidate
	for _, c := range cands {
		if slices.ContainsFunc(c.names, func(n string) bool { return n != "" && (n == ref || n == bare || n == tag) }) {
			named = append(named, c)
		}
	}
	if pin := PinnedDigest(ref); pin != "" && len(named) != 1 {
		named = nil
		for _, c := range cands {
			if slices.Contains(c.chain, pin) {
				named = append(named, c)
			}
		}
	}
	if len(named) == 1 {
		return named[0], nil
	}
	return candidate{}, fmt.Errorf("the layout holds %d images (%s) and none is named %q alone", len(cands), candidateList(cands), ref)
}

var pinRE = regexp.MustCompile(`@(sha256:[0-9a-f]{64})$`)

// PinnedDigest is the digest a reference pins (NAME@sha256:…), or "".
func PinnedDigest(ref string) digest.Digest {
	if m := pinRE.FindStringSubmatch(ref); m != nil {
		return digest.Digest(m[1])
	}
	return ""
}
