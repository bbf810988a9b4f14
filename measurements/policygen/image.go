package policygen

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"path"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/measurements/internal/ociimage"
	"github.com/c8s-dev/c8s/measurements/layer"
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
	// Layers pin the image's file system in the container's rule: each
	// layer's diff ID, dm-verity root and data blocks (`c8s-measure
	// image`), bottom first. Nil when only the config is known: the rule
	// then leaves the root unpinned, with a warning.
	Layers []policyapi.Layer
	// LayerBlobs are the manifest's layer descriptors (compressed digest,
	// media type), one per Layers entry, for the rule's comments.
	LayerBlobs []ocispec.Descriptor
}

// LoadImage reads the image ref from an OCI image layout at path: a
// directory (skopeo copy docker://REF oci:DIR, or the directory of an
// unpacked `docker save` or `ctr images export`) or a tar archive of one,
// optionally gzip-compressed. A layout holding several images is searched
// for ref by the names its index annotates (io.containerd.image.name,
// org.opencontainers.image.ref.name); a multi-platform image gives its
// linux/amd64 manifest. A ref pinned by digest must name the layout's
// index or manifest, and every blob read is checked against its digest.
// Each layer is converted into its layer disk (in the system's temporary
// directory, removed after) to pin it: Image.Layers.
func LoadImage(path, ref string) (*Image, error) {
	ctx := context.Background()
	oi, err := ociimage.OpenLayout(ctx, path, ref)
	if err != nil {
		return nil, err
	}
	return fromOCI(ctx, oi)
}

// fromOCI is the generator's view of an image read by ociimage, its
// layers measured.
func fromOCI(ctx context.Context, oi *ociimage.Image) (*Image, error) {
	layers, err := ociimage.MeasureLayers(ctx, oi, "")
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", oi.Source, err)
	}
	img := &Image{Source: oi.Source, Digests: oi.Digests, Config: oi.ConfigFile.Config, Layers: []policyapi.Layer{}}
	for _, l := range layers {
		img.Layers = append(img.Layers, PolicyLayer(l.Disk))
		img.LayerBlobs = append(img.LayerBlobs, l.Blob)
	}
	img.UserDB = func() ([]byte, []byte, error) { return userDB(ctx, oi) }
	return img, nil
}

// PolicyLayer is the policy's pin of a layer disk.
func PolicyLayer(i layer.Info) policyapi.Layer {
	return policyapi.Layer{Digest: i.DiffID.String(), Verity: i.RootHash, Blocks: i.DataBlocks}
}

// pinnedDigest is the digest a reference pins, or "".
func pinnedDigest(ref string) digest.Digest { return ociimage.PinnedDigest(ref) }

// userDB reads /etc/passwd and /etc/group as the image's layers leave
// them, whiteouts applied; nil for a file the image does not have.
func userDB(ctx context.Context, img *ociimage.Image) (passwd, group []byte, err error) {
	files := map[string][]byte{"etc/passwd": nil, "etc/group": nil}
	for i, l := range img.Manifest.Layers {
		if err := scanLayer(ctx, img, i, files); err != nil {
			return nil, nil, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
	}
	return files["etc/passwd"], files["etc/group"], nil
}

// scanLayer applies layer i to the files tracked.
func scanLayer(ctx context.Context, img *ociimage.Image, i int, files map[string][]byte) error {
	blob, err := img.OpenLayer(ctx, i)
	if err != nil {
		return err
	}
	defer blob.Close()
	r, err := layer.Decompress(blob, img.Manifest.Layers[i].MediaType)
	if err != nil {
		return err
	}
	defer r.Close()
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
	// Read what the digest covers to its end (tar padding, the
	// compression's trailer): the blob's reader checks it there.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, blob); err != nil {
		return err
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
