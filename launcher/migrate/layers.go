package migrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// Image layer disks (runtime.rootfs = "layers") are not on shared storage:
// each node keeps its own layer cache (launcher/layercache), and a layer
// disk is the same bytes on every node that converts the same layer
// (measurements/layer). A pod VM that brings layer disks names them in
// IncomingRequest.Layers; the destination attaches its own copy of each,
// found in its cache by diff ID or converted from the blob in its
// containerd's content store, at the same SCSI target as on the source,
// after checking that its dm-verity root and size are the source's. The
// guest does not depend on that check: its dm-verity devices carry the
// roots of its measured policy across the move, so a layer disk the
// destination changed fails to read in the guest. The check turns a
// mismatch (nodes that convert differently) into a refusal before any
// QEMU starts, naming the layer.

// Layer describes a disk of IncomingRequest.Disks that is an image layer.
type Layer struct {
	// Disk is the disk's ID in IncomingRequest.Disks.
	Disk string `json:"disk"`
	// DiffID is the layer's diff ID (sha256 of its uncompressed tar).
	DiffID digest.Digest `json:"diff_id"`
	// RootHash (hex) and DataBlocks are the source disk's dm-verity
	// parameters, which the guest opened it with.
	RootHash   string `json:"root_hash"`
	DataBlocks uint64 `json:"data_blocks"`
	// Blob is the layer's blob and MediaType its media type, from which
	// the destination converts the layer when its cache lacks it.
	Blob      digest.Digest `json:"blob,omitempty"`
	MediaType string        `json:"media_type,omitempty"`
}

func (l Layer) check() error {
	if err := l.DiffID.Validate(); err != nil || l.DiffID.Algorithm() != digest.SHA256 {
		return fmt.Errorf("layer of disk %q: diff ID %q is not a sha256 digest", l.Disk, l.DiffID)
	}
	if len(l.RootHash) != 64 || strings.Trim(l.RootHash, "0123456789abcdef") != "" {
		return fmt.Errorf("layer %s: dm-verity root %q is not 64 lower-case hex digits", l.DiffID, l.RootHash)
	}
	if l.Blob != "" {
		if err := l.Blob.Validate(); err != nil {
			return fmt.Errorf("layer %s: blob %q: %w", l.DiffID, l.Blob, err)
		}
	}
	return nil
}

// LayerStore gives an incoming VM its layer disks on the destination.
type LayerStore interface {
	// Acquire records ref's use of layer l and returns the path of this
	// node's disk of it, whose dm-verity root and data blocks are l's.
	// ns is the source pod's containerd namespace, where a blob to
	// convert is looked up.
	Acquire(ctx context.Context, l Layer, ns string, ref layercache.Ref) (string, error)
	// Release drops the reference named ref on the layer diffID.
	Release(ctx context.Context, diffID digest.Digest, ref string) error
}

// LayerCache is the node's layer cache (a *layercache.Cache).
type LayerCache interface {
	Acquire(ctx context.Context, diffID digest.Digest, ref layercache.Ref, build layercache.Builder) (layercache.Entry, bool, error)
	Release(ctx context.Context, diffID digest.Digest, ref string) error
}

// Blobs opens blobs of the node's containerd content store in the
// context's namespace (a *ctrdimage.Client).
type Blobs interface {
	OpenBlob(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error)
}

// LayerInfo is what a LayerConverter built.
type LayerInfo struct {
	DiffID     digest.Digest
	RootHash   string
	DataBlocks uint64
	Size       int64
}

// LayerConverter writes the layer disk of a blob of the given media type
// to out (c8s-launcher's is measurements/layer's, which the shim does not
// link).
type LayerConverter func(ctx context.Context, blob io.Reader, mediaType string, out *os.File) (LayerInfo, error)

// CacheLayers is the LayerStore of a node: its layer cache, converting a
// missing layer from the blob in Blobs with Convert when both are set.
type CacheLayers struct {
	Cache LayerCache
	// Dir names the cache in errors.
	Dir     string
	Blobs   Blobs
	Convert LayerConverter
}

// errNoConversion says this node cannot build a layer it lacks.
var errNoConversion = errors.New("this node's migration server has no containerd content store to convert layers from (`c8s-launcher serve --containerd ADDRESS`)")

// Acquire implements LayerStore.
func (c *CacheLayers) Acquire(ctx context.Context, l Layer, ns string, ref layercache.Ref) (string, error) {
	if err := l.check(); err != nil {
		return "", err
	}
	build := func(ctx context.Context, out *os.File) (layercache.Meta, error) {
		if c.Blobs == nil || c.Convert == nil {
			return layercache.Meta{}, errNoConversion
		}
		if l.Blob == "" {
			return layercache.Meta{}, errors.New("the source did not name the layer's blob")
		}
		if ns != "" {
			ctx = namespaces.WithNamespace(ctx, ns)
		}
		rc, err := c.Blobs.OpenBlob(ctx, ocispec.Descriptor{Digest: l.Blob, MediaType: l.MediaType})
		if err != nil {
			return layercache.Meta{}, fmt.Errorf("containerd namespace %q: %w", ns, err)
		}
		defer rc.Close()
		info, err := c.Convert(ctx, rc, l.MediaType, out)
		if err != nil {
			return layercache.Meta{}, fmt.Errorf("convert blob %s (%s): %w", l.Blob, l.MediaType, err)
		}
		return layercache.Meta{DiffID: info.DiffID, RootHash: info.RootHash, DataBlocks: info.DataBlocks, Size: info.Size,
			Source: l.Blob, MediaType: l.MediaType}, nil
	}
	e, built, err := c.Cache.Acquire(ctx, l.DiffID, ref, build)
	if err != nil {
		return "", fmt.Errorf("layer %s (disk %q) is not in this node's layer cache %s and cannot be built here: %w; pull the pod's image on this node, or give its migration server a containerd that has it",
			l.DiffID, l.Disk, c.Dir, err)
	}
	if built {
		log.G(ctx).WithFields(log.Fields{"layer": l.DiffID, "blob": l.Blob, "size": e.Size, "took_ms": e.BuildMillis}).Info("layer disk of an incoming VM built")
	}
	if e.RootHash != l.RootHash || e.DataBlocks != l.DataBlocks {
		if rerr := c.Cache.Release(ctx, l.DiffID, ref.Name); rerr != nil {
			log.G(ctx).WithError(rerr).WithField("layer", l.DiffID).Warn("drop the reference on a refused layer")
		}
		return "", fmt.Errorf("layer %s (disk %q): this node's disk of it has dm-verity root %s over %d data blocks, the source's %s over %d: refusing the VM, whose guest opened the layer with the source's root "+
			"(the nodes convert layers differently: run the same c8s release on both, or remove the layer from this node's cache %s)",
			l.DiffID, l.Disk, e.RootHash, e.DataBlocks, l.RootHash, l.DataBlocks, c.Dir)
	}
	return e.Path, nil
}

// Release implements LayerStore.
func (c *CacheLayers) Release(ctx context.Context, diffID digest.Digest, ref string) error {
	return c.Cache.Release(ctx, diffID, ref)
}

// incomingDisks resolves the disks of an incoming VM, in their order (the
// SCSI targets): layer disks from store with a reference named after the
// VM, the others below the shared storage root (checkDiskPaths). release
// drops the references taken; on error none are left.
func incomingDisks(ctx context.Context, req IncomingRequest, sharedRoot string, store func() (LayerStore, error), stateDir string) (_ []vm.Disk, _ func(context.Context), code int, retErr error) {
	byDisk := map[string]Layer{}
	for _, l := range req.Layers {
		if _, dup := byDisk[l.Disk]; dup {
			return nil, nil, http.StatusBadRequest, fmt.Errorf("disk %q is named by two layers", l.Disk)
		}
		byDisk[l.Disk] = l
	}
	var plain []vm.Disk
	seen := map[string]bool{}
	for _, d := range req.Disks {
		seen[d.ID] = true
		if _, ok := byDisk[d.ID]; !ok {
			plain = append(plain, d)
		}
	}
	for _, l := range req.Layers {
		if !seen[l.Disk] {
			return nil, nil, http.StatusBadRequest, fmt.Errorf("layer %s names disk %q, which the VM does not bring", l.DiffID, l.Disk)
		}
	}
	shared, err := checkDiskPaths(sharedRoot, plain)
	if err != nil {
		return nil, nil, http.StatusForbidden, err
	}
	sharedByID := map[string]vm.Disk{}
	for _, d := range shared {
		sharedByID[d.ID] = d
	}

	type held struct {
		diffID digest.Digest
		ref    string
	}
	var (
		refs []held
		ls   LayerStore
	)
	release := func(ctx context.Context) {
		for _, h := range refs {
			if err := ls.Release(ctx, h.diffID, h.ref); err != nil {
				log.G(ctx).WithError(err).WithFields(log.Fields{"vm": req.ID, "layer": h.diffID}).Warn("drop the reference of a VM that migrated here")
			}
		}
	}
	defer func() {
		if retErr != nil {
			release(context.WithoutCancel(ctx))
		}
	}()
	var ref layercache.Ref
	if len(req.Layers) > 0 {
		if ls, err = store(); err != nil {
			return nil, nil, http.StatusInternalServerError, fmt.Errorf("the layer cache: %w", err)
		}
		if ref, err = layercache.IncomingRef(req.ID, stateDir); err != nil {
			return nil, nil, http.StatusInternalServerError, err
		}
	}
	out := make([]vm.Disk, 0, len(req.Disks))
	for _, d := range req.Disks {
		l, isLayer := byDisk[d.ID]
		if !isLayer {
			out = append(out, sharedByID[d.ID])
			continue
		}
		path, err := ls.Acquire(ctx, l, req.Namespace, ref)
		if err != nil {
			return nil, nil, http.StatusConflict, err
		}
		refs = append(refs, held{l.DiffID, ref.Name})
		// A layer is read-only whatever the request says.
		out = append(out, vm.Disk{ID: d.ID, Path: path, ReadOnly: true})
	}
	return out, release, 0, nil
}
