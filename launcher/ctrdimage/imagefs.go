package ctrdimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	introspectionapi "github.com/containerd/containerd/api/services/introspection/v1"
	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/c8s-dev/c8s/launcher/layercache"
)

// What containerd 2.2's CRI reports as the image file system
// (ImageFsInfo, internal/cri/server/images/imagefs_info.go): one entry
// per snapshotter it syncs, the first its default snapshotter's, with
// Mountpoint that snapshotter's root directory and UsedBytes the sum of
// the Usage of every snapshot in containerd's namespace "k8s.io" of that
// snapshotter (re-read every stats_collect_period, 10 s by default;
// committed snapshots once). The content store is not counted (a TODO
// there), nor any other directory. Kubelet takes UsedBytes from there and
// capacity and available bytes from a statfs of the mountpoint's file
// system; its image GC and imagefs.available eviction act on the latter.
//
// ImageFS counts each cached layer as one snapshot of that snapshotter:
// a snapshot whose directory holds a hard link to the layer's disk (the
// same blocks, not a copy), committed, so that its Usage is the disk's
// allocated size. The snapshot is held by a lease of its own, labelled
// with the cache and the diff ID, so that containerd's garbage collector
// keeps it until Remove deletes the lease (synchronously: the link is
// gone when Remove returns). A hard link needs the cache on the
// snapshotter's file system, which is also what makes its blocks count
// in that statfs; a cache elsewhere is refused with ErrNotOnImageFS.

// CRINamespace is the containerd namespace CRI keeps images and
// snapshots in, and the only one its ImageFsInfo measures.
const CRINamespace = "k8s.io"

// Labels of the leases (and snapshots) that count cached layers.
const (
	LabelLayerCache = "c8s.dev/layer-cache" // the cache's directory
	LabelLayer      = "c8s.dev/layer"       // the layer's diff ID
)

// snapshotterPluginType is the introspection type of snapshotters.
const snapshotterPluginType = "io.containerd.snapshotter.v1"

// ErrNotOnImageFS says the layer cache is on another file system than
// the snapshotter CRI measures, so it cannot be counted there (and
// kubelet's statfs of the image file system does not see it either).
var ErrNotOnImageFS = errors.New("the layer cache is not on containerd's image file system")

// ImageFS counts the layers of one layer cache in the image file system
// of the containerd at an address: a layercache.Accountant. It connects
// for each call; what it learns of containerd (the snapshotter CRI
// measures) it keeps.
type ImageFS struct {
	address string
	dir     string
	tag     string

	mu          sync.Mutex
	snapshotter string // CRI's, once learnt
	root        string // its root: the image file system's mountpoint
}

var _ layercache.Accountant = (*ImageFS)(nil)

// NewImageFS returns the Accountant of the layer cache in cacheDir for
// the containerd whose gRPC socket is address.
func NewImageFS(address, cacheDir string) *ImageFS {
	sum := sha256.Sum256([]byte(cacheDir))
	return &ImageFS{address: address, dir: cacheDir, tag: hex.EncodeToString(sum[:4])}
}

// SnapshotName is the snapshot that counts the layer diffID.
func (f *ImageFS) SnapshotName(diffID digest.Digest) string {
	return "c8s-layer-cache/" + f.tag + "/" + diffID.String()
}

// leaseID is the lease that holds it: at most 76 characters of
// [A-Za-z0-9._-], as containerd's identifiers must be.
func (f *ImageFS) leaseID(diffID digest.Digest) string {
	return "c8s-layers-" + f.tag + "-" + diffID.Encoded()[:56]
}

// with connects to containerd and calls fn in CRI's namespace.
func (f *ImageFS) with(ctx context.Context, fn func(ctx context.Context, c *Client) error) error {
	c, err := Dial(f.address)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(namespaces.WithNamespace(ctx, CRINamespace), c)
}

// Add counts the cached layer e (layercache.Accountant).
func (f *ImageFS) Add(ctx context.Context, e layercache.Entry) error {
	return f.with(ctx, func(ctx context.Context, c *Client) error { return f.add(ctx, c, e) })
}

func (f *ImageFS) add(ctx context.Context, c *Client, e layercache.Entry) (retErr error) {
	sn, root, err := f.imageSnapshotter(ctx, c)
	if err != nil {
		return err
	}
	ls := leasesapi.NewLeasesClient(c.conn)
	lid, name := f.leaseID(e.DiffID), f.SnapshotName(e.DiffID)
	held, err := f.holds(ctx, ls, lid, name)
	if err != nil {
		return err
	}
	if held {
		return nil
	}
	// What an Add that crashed left (a lease without its snapshot, or
	// snapshots no lease holds any more) goes first.
	if err := f.deleteLease(ctx, ls, lid); err != nil {
		return err
	}
	key := name + "/prepare"
	for _, k := range []string{key, name} {
		if _, err := c.snapshots.Remove(ctx, &snapshotsapi.RemoveSnapshotRequest{Snapshotter: sn, Key: k}); err != nil {
			if err = errgrpc.ToNative(err); !errdefs.IsNotFound(err) {
				return fmt.Errorf("containerd: remove the leftover snapshot %s (%s): %w", k, sn, err)
			}
		}
	}
	labels := map[string]string{LabelLayerCache: f.dir, LabelLayer: e.DiffID.String()}
	if _, err := ls.Create(ctx, &leasesapi.CreateRequest{ID: lid, Labels: labels}); err != nil {
		return fmt.Errorf("containerd: create lease %s: %w", lid, errgrpc.ToNative(err))
	}
	defer func() {
		if retErr != nil {
			f.deleteLease(context.WithoutCancel(ctx), ls, lid)
		}
	}()
	lctx := leases.WithLease(ctx, lid)
	pr, err := c.snapshots.Prepare(lctx, &snapshotsapi.PrepareSnapshotRequest{Snapshotter: sn, Key: key, Labels: labels})
	if err != nil {
		return fmt.Errorf("containerd: prepare snapshot %s (%s): %w", key, sn, errgrpc.ToNative(err))
	}
	dir, err := snapshotDir(pr.Mounts)
	if err != nil {
		return fmt.Errorf("snapshotter %s: %w: cannot count the layer cache in it", sn, err)
	}
	if err := os.Link(e.Path, filepath.Join(dir, filepath.Base(e.Path))); err != nil {
		if errors.Is(err, syscall.EXDEV) {
			return fmt.Errorf("%w: layer cache %s and snapshotter %s (%s) are on different file systems, so kubelet's image file system stats, image GC and imagefs eviction do not see the cache: set runtime.layer_cache_dir to a directory on that file system",
				ErrNotOnImageFS, f.dir, sn, root)
		}
		return fmt.Errorf("link the disk of layer %s into snapshot %s: %w", e.DiffID, key, err)
	}
	if _, err := c.snapshots.Commit(lctx, &snapshotsapi.CommitSnapshotRequest{Snapshotter: sn, Name: name, Key: key, Labels: labels}); err != nil {
		return fmt.Errorf("containerd: commit snapshot %s (%s): %w", name, sn, errgrpc.ToNative(err))
	}
	return nil
}

// holds reports whether lease lid exists and holds the snapshot name.
func (f *ImageFS) holds(ctx context.Context, ls leasesapi.LeasesClient, lid, name string) (bool, error) {
	r, err := ls.ListResources(ctx, &leasesapi.ListResourcesRequest{ID: lid})
	if err != nil {
		if err = errgrpc.ToNative(err); errdefs.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("containerd: resources of lease %s: %w", lid, err)
	}
	for _, res := range r.Resources {
		if res.ID == name && strings.HasPrefix(res.Type, "snapshots/") {
			return true, nil
		}
	}
	return false, nil
}

// deleteLease deletes lease lid and, synchronously, what only it held.
func (f *ImageFS) deleteLease(ctx context.Context, ls leasesapi.LeasesClient, lid string) error {
	_, err := ls.Delete(ctx, &leasesapi.DeleteRequest{ID: lid, Sync: true})
	if err != nil {
		if err = errgrpc.ToNative(err); !errdefs.IsNotFound(err) {
			return fmt.Errorf("containerd: delete lease %s: %w", lid, err)
		}
	}
	return nil
}

// Remove stops counting the layer diffID (layercache.Accountant): its
// lease goes, and with it, before Remove returns, its snapshot and the
// hard link.
func (f *ImageFS) Remove(ctx context.Context, diffID digest.Digest) error {
	return f.with(ctx, func(ctx context.Context, c *Client) error {
		return f.deleteLease(ctx, leasesapi.NewLeasesClient(c.conn), f.leaseID(diffID))
	})
}

// Counted lists the layers of the cache that are counted
// (layercache.Accountant): those whose lease holds their snapshot.
func (f *ImageFS) Counted(ctx context.Context) ([]digest.Digest, error) {
	var out []digest.Digest
	err := f.with(ctx, func(ctx context.Context, c *Client) error {
		ls := leasesapi.NewLeasesClient(c.conn)
		r, err := ls.List(ctx, &leasesapi.ListRequest{})
		if err != nil {
			return fmt.Errorf("containerd: list leases: %w", errgrpc.ToNative(err))
		}
		for _, l := range r.Leases {
			d := digest.Digest(l.Labels[LabelLayer])
			if l.Labels[LabelLayerCache] != f.dir || d.Validate() != nil || l.ID != f.leaseID(d) {
				continue
			}
			held, err := f.holds(ctx, ls, l.ID, f.SnapshotName(d))
			if err != nil {
				return err
			}
			if held {
				out = append(out, d)
			}
		}
		return nil
	})
	return out, err
}

// imageSnapshotter returns the snapshotter whose snapshots CRI's
// ImageFsInfo sums: the one whose root is the first image file
// system's mountpoint, and that root.
func (f *ImageFS) imageSnapshotter(ctx context.Context, c *Client) (name, root string, _ error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.snapshotter != "" {
		return f.snapshotter, f.root, nil
	}
	mps, err := imageFSMountpoints(ctx, c.conn)
	if status.Code(err) == codes.Unimplemented {
		return "", "", layercache.ErrNoImageFS
	}
	if err != nil {
		return "", "", fmt.Errorf("containerd: CRI ImageFsInfo: %w", errgrpc.ToNative(err))
	}
	if len(mps) == 0 || mps[0] == "" {
		return "", "", fmt.Errorf("containerd's CRI reports no image file system: %w", layercache.ErrNoImageFS)
	}
	mp := mps[0]
	pr, err := introspectionapi.NewIntrospectionClient(c.conn).Plugins(ctx, &introspectionapi.PluginsRequest{Filters: []string{`type=="` + snapshotterPluginType + `"`}})
	if err != nil {
		return "", "", fmt.Errorf("containerd: list snapshotters: %w", errgrpc.ToNative(err))
	}
	sn, err := snapshotterAt(mp, pr.Plugins)
	if err != nil {
		return "", "", err
	}
	f.snapshotter, f.root = sn, mp
	return sn, mp, nil
}

// snapshotterAt names the snapshotter whose root is mountpoint: the
// plugin exporting it as its root, else the one CRI would place there
// (<containerd root>/io.containerd.snapshotter.v1.<name>).
func snapshotterAt(mountpoint string, plugins []*introspectionapi.Plugin) (string, error) {
	for _, p := range plugins {
		if p.Type == snapshotterPluginType && p.Exports["root"] != "" && filepath.Clean(p.Exports["root"]) == filepath.Clean(mountpoint) {
			return p.ID, nil
		}
	}
	if name, ok := strings.CutPrefix(filepath.Base(mountpoint), snapshotterPluginType+"."); ok && name != "" {
		return name, nil
	}
	return "", fmt.Errorf("no snapshotter of containerd's has CRI's image file system %s as its root", mountpoint)
}

// snapshotDir is the directory a new snapshot with no parent writes to:
// the source of its bind mount (overlayfs, native), or its upperdir.
func snapshotDir(mounts []*types.Mount) (string, error) {
	if len(mounts) != 1 {
		return "", fmt.Errorf("a new snapshot has %d mounts, not one directory", len(mounts))
	}
	m := mounts[0]
	switch m.Type {
	case "bind", "rbind":
		if filepath.IsAbs(m.Source) {
			return m.Source, nil
		}
	case "overlay":
		for _, o := range m.Options {
			if d, ok := strings.CutPrefix(o, "upperdir="); ok && filepath.IsAbs(d) {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("a new snapshot is a %q mount of %q, not a directory on the host", m.Type, m.Source)
}
