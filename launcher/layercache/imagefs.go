package layercache

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
)

// The node's image file system stats (CRI ImageFsInfo, what kubelet
// reports as its image file system) sum the snapshots of containerd's
// CRI snapshotter; the layer cache is none of them. An Accountant makes
// each cached layer count there (launcher/ctrdimage's ImageFS: a
// snapshot holding a hard link to the layer's disk, so no byte is
// stored twice). The cache calls it under the layer's lock: Add once a
// layer is built, Remove before Prune deletes one, so that a layer is
// counted while, and only while, its disk exists. SyncAccounts repairs
// what a crash, an unreachable containerd or a cache filled before
// accounting left.

// ErrNoImageFS says the Accountant has nowhere to count layers (the
// containerd it talks to serves no CRI): nothing measures an image file
// system, so nothing is to be done.
var ErrNoImageFS = errors.New("containerd serves no CRI image file system to count layers in")

// Accountant counts cached layers in the node's image file system.
type Accountant interface {
	// Add counts the complete layer e. Counting a layer already counted
	// is not an error.
	Add(ctx context.Context, e Entry) error
	// Remove stops counting the layer diffID and frees what counting it
	// held. A layer not counted is not an error.
	Remove(ctx context.Context, diffID digest.Digest) error
	// Counted lists the layers of this cache that are counted.
	Counted(ctx context.Context) ([]digest.Digest, error)
}

// Account makes the cache count its layers with a (nil: not at all)
// from now on. Layers cached before are counted by SyncAccounts.
func (c *Cache) Account(a Accountant) { c.acct = a }

// account counts the layer just built. A layer that cannot be counted
// still serves its pod: the failure is logged, and SyncAccounts (run by
// `c8s-launcher layers prune|sync`) retries it. The caller holds the
// layer's lock.
func (c *Cache) account(ctx context.Context, e Entry) {
	if c.acct == nil {
		return
	}
	err := c.acct.Add(ctx, e)
	switch {
	case err == nil:
	case errors.Is(err, ErrNoImageFS):
		log.G(ctx).WithField("layer", e.DiffID).Debug("layer not counted: no CRI image file system")
	default:
		log.G(ctx).WithError(err).WithField("layer", e.DiffID).Warn("layer cache: the new layer is not counted in containerd's image file system (CRI ImageFsInfo); `c8s-launcher layers sync` retries")
	}
}

// unaccount stops counting the layer hex before Prune removes it. The
// caller holds the layer's lock.
func (c *Cache) unaccount(ctx context.Context, hex string) error {
	if c.acct == nil {
		return nil
	}
	d := digest.NewDigestFromEncoded(digest.SHA256, hex)
	if err := c.acct.Remove(ctx, d); err != nil {
		return fmt.Errorf("layer %s kept: stop counting it in containerd's image file system: %w (its disk's blocks stay held there until that succeeds)", d, err)
	}
	return nil
}

// Synced is what SyncAccounts changed.
type Synced struct {
	// Added are the cached layers it counted; Removed the counted
	// layers that were no longer cached.
	Added, Removed []digest.Digest
}

// SyncAccounts makes the Accountant count exactly the complete layers
// of the cache: those cached but not counted are added, those counted
// but no longer cached removed, each under its layer's lock. With no
// Accountant it does nothing. It returns ErrNoImageFS itself (with what
// it removed) when the layers cannot be counted at all and nothing else
// failed.
func (c *Cache) SyncAccounts(ctx context.Context) (Synced, error) {
	var s Synced
	if c.acct == nil {
		return s, nil
	}
	counted, err := c.acct.Counted(ctx)
	if err != nil {
		return s, err
	}
	isCounted := map[string]bool{}
	for _, d := range counted {
		if checkDiffID(d) == nil {
			isCounted[d.Encoded()] = true
		}
	}
	hexes, err := c.names()
	if err != nil {
		return s, err
	}
	var errs []error
	noImageFS := false
	for _, hex := range hexes {
		if isCounted[hex] || noImageFS {
			continue
		}
		added, err := c.syncOne(ctx, hex, false)
		if errors.Is(err, ErrNoImageFS) {
			noImageFS = true
			continue
		}
		if err != nil {
			errs = append(errs, err)
		} else if added {
			s.Added = append(s.Added, digest.NewDigestFromEncoded(digest.SHA256, hex))
		}
	}
	for hex := range isCounted {
		removed, err := c.syncOne(ctx, hex, true)
		if err != nil {
			errs = append(errs, err)
		} else if removed {
			s.Removed = append(s.Removed, digest.NewDigestFromEncoded(digest.SHA256, hex))
		}
	}
	if noImageFS {
		if len(errs) == 0 {
			return s, ErrNoImageFS
		}
		errs = append(errs, ErrNoImageFS)
	}
	return s, errors.Join(errs...)
}

// syncOne adds the layer hex if it is cached and !counted, or removes
// it if it is not cached and counted, under its lock. It reports
// whether it changed anything.
func (c *Cache) syncOne(ctx context.Context, hex string, counted bool) (bool, error) {
	unlock, err := c.lock(ctx, hex)
	if err != nil {
		return false, err
	}
	defer unlock()
	e, err := c.lookup(hex)
	cached := err == nil
	if err != nil && !errors.Is(err, ErrNotCached) {
		return false, err
	}
	switch {
	case cached && !counted:
		if err := c.acct.Add(ctx, e); err != nil {
			return false, fmt.Errorf("count layer %s: %w", e.DiffID, err)
		}
		return true, nil
	case !cached && counted:
		d := digest.NewDigestFromEncoded(digest.SHA256, hex)
		if err := c.acct.Remove(ctx, d); err != nil {
			return false, fmt.Errorf("stop counting layer %s: %w", d, err)
		}
		return true, nil
	}
	return false, nil
}
