package policygen

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // registers sha256 for go-digest
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

// Image is what the generator takes from a container image.
type Image struct {
	// Source names where it was read, for messages.
	Source string
	// Digests are those of the index and manifest that lead to Config,
	// outermost first: a reference pinned by digest must name one.
	Digests []digest.Digest
	// Config is the image's configuration: entrypoint, cmd, env, working
	// dir, user.
	Config ocispec.ImageConfig
	// UserDB returns the image's /etc/passwd and /etc/group (nil when the
	// image has none), read only when a user must be resolved; nil means
	// the image has neither.
	UserDB func() (passwd, group []byte, err error)
}

// Media types of indexes and manifests, OCI's and Docker's.
const (
	mediaDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
	mediaDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
)

// maxJSON bounds the JSON blobs (indexes, manifests, configs) read.
const maxJSON = 8 << 20

// LoadImage reads the image ref from an OCI image layout at path: a
// directory (skopeo copy docker://REF oci:DIR, or the directory of an
// unpacked `docker save` or `ctr images export`) or a tar archive of one,
// optionally gzip-compressed. A layout holding several images is searched
// for ref by the names its index annotates (io.containerd.image.name,
// org.opencontainers.image.ref.name); a multi-platform image gives its
// linux/amd64 manifest. A ref pinned by digest must name the layout's
// index or manifest, and every blob read is checked against its digest.
func LoadImage(path, ref string) (*Image, error) {
	st, err := openStore(path)
	if err != nil {
		return nil, err
	}
	img, err := loadImage(st, ref)
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", path, err)
	}
	img.Source = path
	return img, nil
}

// store reads the files of an image layout.
type store interface {
	// open opens the file called name (slash-separated, relative).
	open(name string) (io.ReadCloser, error)
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

// decompress sniffs gzip (and refuses zstd) compression.
func decompress(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		return gzip.NewReader(br)
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return nil, errors.New("zstd-compressed data is not read: convert the layout to gzip layers, or set runAsUser and runAsGroup numerically")
	}
	return br, nil
}

// readJSON reads the file name, checks its digest when want is set, and
// decodes it into v.
func readJSON(st store, name string, want digest.Digest, v any) error {
	f, err := st.open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxJSON+1))
	if err != nil {
		return err
	}
	if len(data) > maxJSON {
		return fmt.Errorf("%s is larger than %d bytes", name, maxJSON)
	}
	if want != "" && digest.FromBytes(data) != want {
		return fmt.Errorf("blob %s does not have its digest (%s)", name, digest.FromBytes(data))
	}
	return json.Unmarshal(data, v)
}

// blobName is the layout path of a blob, refusing digests that are not.
func blobName(d digest.Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", fmt.Errorf("digest %q: %w", d, err)
	}
	return "blobs/" + d.Algorithm().String() + "/" + d.Encoded(), nil
}

// candidate is a manifest the layout's index leads to.
type candidate struct {
	chain []digest.Digest
	names []string // the names the index annotates it with
	desc  ocispec.Descriptor
}

func loadImage(st store, ref string) (*Image, error) {
	var idx ocispec.Index
	if err := readJSON(st, ocispec.ImageIndexFile, "", &idx); err != nil {
		return nil, fmt.Errorf("not an OCI image layout (%w)", err)
	}
	var cands []candidate
	var walk func(descs []ocispec.Descriptor, chain []digest.Digest, names []string, depth int) error
	walk = func(descs []ocispec.Descriptor, chain []digest.Digest, names []string, depth int) error {
		for _, d := range descs {
			n := names
			if depth == 0 {
				n = []string{d.Annotations["io.containerd.image.name"], d.Annotations[ocispec.AnnotationRefName]}
			}
			if p := d.Platform; p != nil && (p.OS != "linux" || p.Architecture != "amd64") {
				continue // another platform, or an attestation ("unknown")
			}
			c := append(slices.Clone(chain), d.Digest)
			switch d.MediaType {
			case ocispec.MediaTypeImageIndex, mediaDockerList:
				if depth > 4 {
					return errors.New("indexes nested too deep")
				}
				name, err := blobName(d.Digest)
				if err != nil {
					return err
				}
				var sub ocispec.Index
				if err := readJSON(st, name, d.Digest, &sub); err != nil {
					return err
				}
				if err := walk(sub.Manifests, c, n, depth+1); err != nil {
					return err
				}
			case ocispec.MediaTypeImageManifest, mediaDockerManifest:
				cands = append(cands, candidate{chain: c, names: n, desc: d})
			}
		}
		return nil
	}
	if err := walk(idx.Manifests, nil, nil, 0); err != nil {
		return nil, err
	}
	c, err := pick(cands, ref)
	if err != nil {
		return nil, err
	}
	if pin := pinnedDigest(ref); pin != "" && !slices.Contains(c.chain, pin) {
		return nil, fmt.Errorf("the image pins %s, but the layout's image is %s: the layout holds another image", pin, digestList(c.chain))
	}
	name, err := blobName(c.desc.Digest)
	if err != nil {
		return nil, err
	}
	var m ocispec.Manifest
	if err := readJSON(st, name, c.desc.Digest, &m); err != nil {
		return nil, err
	}
	if name, err = blobName(m.Config.Digest); err != nil {
		return nil, err
	}
	var cfg ocispec.Image
	if err := readJSON(st, name, m.Config.Digest, &cfg); err != nil {
		return nil, err
	}
	layers := m.Layers
	img := &Image{Digests: c.chain, Config: cfg.Config}
	img.UserDB = func() ([]byte, []byte, error) { return userDB(st, layers) }
	return img, nil
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
	if pin := pinnedDigest(ref); pin != "" && len(named) != 1 {
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
	var all []string
	for _, c := range cands {
		all = append(all, digestList(c.chain))
	}
	return candidate{}, fmt.Errorf("the layout holds %d images (%s) and none is named %q alone", len(cands), strings.Join(all, ", "), ref)
}

func digestList(ds []digest.Digest) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, " → ")
}

var pinRE = regexp.MustCompile(`@(sha256:[0-9a-f]{64})$`)

// pinnedDigest is the digest a reference pins, or "".
func pinnedDigest(ref string) digest.Digest {
	if m := pinRE.FindStringSubmatch(ref); m != nil {
		return digest.Digest(m[1])
	}
	return ""
}

// userDB reads /etc/passwd and /etc/group as the image's layers leave
// them, whiteouts applied; nil for a file the image does not have.
func userDB(st store, layers []ocispec.Descriptor) (passwd, group []byte, err error) {
	files := map[string][]byte{"etc/passwd": nil, "etc/group": nil}
	for _, l := range layers {
		if err := scanLayer(st, l, files); err != nil {
			return nil, nil, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
	}
	return files["etc/passwd"], files["etc/group"], nil
}

// scanLayer applies one layer to the files tracked.
func scanLayer(st store, l ocispec.Descriptor, files map[string][]byte) error {
	name, err := blobName(l.Digest)
	if err != nil {
		return err
	}
	f, err := st.open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	verifier := l.Digest.Verifier()
	tee := io.TeeReader(f, verifier)
	r, err := decompress(tee)
	if err != nil {
		return err
	}
	added := map[string][]byte{}
	deleted := map[string]bool{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		p := path.Clean(strings.TrimPrefix(h.Name, "/"))
		dir, base := path.Split(p)
		dir = strings.TrimSuffix(dir, "/")
		switch {
		case base == ".wh..wh..opq" && dir == "etc", p == ".wh.etc":
			for k := range files {
				deleted[k] = true
			}
		case strings.HasPrefix(base, ".wh.") && dir == "etc":
			deleted["etc/"+strings.TrimPrefix(base, ".wh.")] = true
		}
		if _, tracked := files[p]; !tracked {
			continue
		}
		if h.Typeflag != tar.TypeReg {
			return fmt.Errorf("/%s is a link or not a regular file: not followed; set runAsUser and runAsGroup numerically", p)
		}
		data, err := io.ReadAll(io.LimitReader(tr, 1<<20))
		if err != nil {
			return err
		}
		added[p] = data
	}
	// Read what the digest covers to its end (tar padding, gzip trailer).
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return err
	}
	if !verifier.Verified() {
		return errors.New("the layer does not have its digest")
	}
	for k := range deleted {
		if _, ok := files[k]; ok {
			files[k] = nil
		}
	}
	for k, v := range added {
		files[k] = v
	}
	return nil
}
