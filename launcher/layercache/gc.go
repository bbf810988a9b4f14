package layercache

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/opencontainers/go-digest"
)

// Layer is a cached layer as List reports it.
type Layer struct {
	Entry
	// Allocated is the disk space the disk takes (its blocks).
	Allocated int64
	// Refs are the pods referencing it, stale ones included.
	Refs []RefState
}

// LiveRefs counts the references whose pod still exists.
func (l Layer) LiveRefs() int {
	n := 0
	for _, r := range l.Refs {
		if r.Live {
			n++
		}
	}
	return n
}

// List returns the complete layers of the cache, by diff ID.
func (c *Cache) List() ([]Layer, error) {
	hexes, err := c.names()
	if err != nil {
		return nil, err
	}
	var out []Layer
	for _, hex := range hexes {
		e, err := c.lookup(hex)
		if errors.Is(err, ErrNotCached) {
			continue
		}
		if err != nil {
			return nil, err
		}
		refs, err := c.refs(hex)
		if err != nil {
			return nil, err
		}
		out = append(out, Layer{Entry: e, Allocated: allocated(e.Path), Refs: refs})
	}
	return out, nil
}

// Pruned is what Prune removed.
type Pruned struct {
	// Layers are the complete layers removed.
	Layers []Entry
	// Bytes is the disk space they took.
	Bytes int64
	// StaleRefs counts references of pods that were gone.
	StaleRefs int
}

// Prune removes every layer that no live pod references and for which
// keep (nil: none) returns false, along with stale references and what
// interrupted builds left. It takes each layer's lock, so a layer a pod is
// acquiring is either kept (its reference is recorded) or removed before
// the pod builds it again. Where the cache counts its layers in the
// image file system (Account), a layer stops being counted before its
// disk goes, and one that cannot stop is kept (the count holds its
// disk's blocks: removing only the disk would free nothing).
func (c *Cache) Prune(ctx context.Context, keep func(digest.Digest) bool) (Pruned, error) {
	var p Pruned
	hexes, err := c.names()
	if err != nil {
		return p, err
	}
	var errs []error
	for _, hex := range hexes {
		if err := c.pruneOne(ctx, hex, keep, &p); err != nil {
			errs = append(errs, err)
		}
	}
	return p, errors.Join(errs...)
}

func (c *Cache) pruneOne(ctx context.Context, hex string, keep func(digest.Digest) bool, p *Pruned) error {
	unlock, err := c.lock(ctx, hex)
	if err != nil {
		return err
	}
	defer unlock()
	refs, err := c.refs(hex)
	if err != nil {
		return err
	}
	live := false
	for _, r := range refs {
		if r.Live {
			live = true
			continue
		}
		if err := c.removeRef(hex, r.Name); err != nil {
			return err
		}
		p.StaleRefs++
	}
	diffID := digest.NewDigestFromEncoded(digest.SHA256, hex)
	e, err := c.lookup(hex)
	complete := err == nil
	if err != nil && !errors.Is(err, ErrNotCached) {
		return err
	}
	if live || (complete && keep != nil && keep(diffID)) {
		return nil
	}
	if err := c.unaccount(ctx, hex); err != nil {
		return err
	}
	size := allocated(c.DiskPath(diffID))
	for _, f := range []string{c.DiskPath(diffID), c.metaPath(hex)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("layer cache: %w", err)
		}
	}
	c.removeTemps(hex)
	os.Remove(c.refDir(hex))
	c.removeLock(hex)
	if complete {
		p.Layers = append(p.Layers, e)
		p.Bytes += size
	}
	return nil
}

// names lists the diff ID hexes the cache has any file of.
func (c *Cache) names() ([]string, error) {
	set := map[string]bool{}
	add := func(dir string, name func(string) string) error {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("layer cache: %w", err)
		}
		for _, e := range ents {
			if h := name(e.Name()); isHexName(h) {
				set[h] = true
			}
		}
		return nil
	}
	trim := func(suffixes ...string) func(string) string {
		return func(n string) string {
			for _, s := range suffixes {
				if h, ok := strings.CutSuffix(n, s); ok {
					return h
				}
			}
			return ""
		}
	}
	prefix := func(n string) string { h, _, _ := strings.Cut(n, "."); return h }
	errs := []error{
		add(c.dir, trim(diskSuffix, metaSuffix)),
		add(filepath.Join(c.dir, refsDir), func(n string) string { return n }),
		add(filepath.Join(c.dir, locksDir), trim(".lock")),
		add(filepath.Join(c.dir, tmpDir), prefix),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(set))
	for h := range set {
		out = append(out, h)
	}
	sort.Strings(out)
	return out, nil
}

// Stats sums up a cache directory.
type Stats struct {
	// Layers counts the complete layers, Bytes their disks' sizes and
	// Allocated the space those take.
	Layers    int
	Bytes     int64
	Allocated int64
}

// Usage reads the stats of the cache in dir without changing it; a
// missing directory is an empty cache.
func Usage(dir string) (Stats, error) {
	var s Stats
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	c := &Cache{dir: dir, alive: liveRef}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return s, fmt.Errorf("layer cache: %w", err)
	}
	for _, ent := range ents {
		hex, ok := strings.CutSuffix(ent.Name(), diskSuffix)
		if !ok || !isHexName(hex) {
			continue
		}
		e, err := c.lookup(hex)
		if err != nil {
			continue
		}
		s.Layers++
		s.Bytes += e.Size
		s.Allocated += allocated(e.Path)
	}
	return s, nil
}

// allocated is the disk space file p takes (0 if it cannot be read).
func allocated(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return st.Size()
}
