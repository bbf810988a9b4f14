// Package layercache is the node's cache of image layer disks: one
// read-only disk per layer diff ID, in c8s's layer format
// (measurements/layer: the layer's files as ext4, then their dm-verity
// tree), built once and shared by every pod and container on the node.
//
// Layout of the cache directory (runtime.layer_cache_dir):
//
//	<hex>.disk          the layer disk, mode 0444, never written after
//	                    its rename into place
//	<hex>.json          its Meta (root hash, data blocks, size, source)
//	refs/<hex>/<name>   one file per pod that uses the layer (Ref)
//	locks/<hex>.lock    flock(2) per diff ID
//	tmp/                disks being built
//
// where <hex> is the diff ID's sha256 in hex. Every change to a layer's
// files happens under its lock: Acquire records the pod's reference and
// builds a missing disk, so that concurrent shims never convert a layer
// twice and Prune never removes a disk between a pod's reference and its
// attachment. A disk is built in tmp/, synced, and renamed into place after
// its Meta, so a crash never leaves a partial disk under the final name;
// an entry is complete only when both files exist and agree on the size.
//
// With an Accountant (Account; imagefs.go), each complete layer is also
// counted in the node's image file system, the one kubelet sees through
// CRI's ImageFsInfo: counted once built, uncounted before Prune removes
// it, both under its lock.
//
// The host does not check a cached disk's bytes: the guest opens every
// layer through dm-verity with the root hash of its measured policy, so a
// disk changed on the host fails to read in the guest.
package layercache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
)

// File names in the cache directory.
const (
	diskSuffix = ".disk"
	metaSuffix = ".json"
	refsDir    = "refs"
	locksDir   = "locks"
	tmpDir     = "tmp"
)

// ErrNotCached is returned by Lookup for a layer the cache does not hold.
var ErrNotCached = errors.New("layer is not in the cache")

// Meta describes one cached layer disk.
type Meta struct {
	// DiffID is the layer's diff ID (sha256 of its uncompressed tar).
	DiffID digest.Digest `json:"diff_id"`
	// RootHash (hex) and DataBlocks are the disk's dm-verity parameters:
	// the tree (sha256, 4096-byte blocks, no salt) starts at block
	// DataBlocks.
	RootHash   string `json:"root_hash"`
	DataBlocks uint64 `json:"data_blocks"`
	// Size is the disk's size in bytes.
	Size int64 `json:"size"`
	// Source is the digest of the blob the disk was built from, and
	// MediaType its media type.
	Source    digest.Digest `json:"source,omitempty"`
	MediaType string        `json:"media_type,omitempty"`
	// Created is when the disk was built, and BuildMillis how long that
	// took.
	Created     time.Time `json:"created"`
	BuildMillis int64     `json:"build_ms"`
}

// Entry is a complete cached layer.
type Entry struct {
	Meta
	// Path is the disk's file.
	Path string
}

// Builder writes the disk of one layer to out (a new, empty file in the
// cache's directory) and describes it. The cache checks the diff ID it
// reports, then syncs out and renames it into place.
type Builder func(ctx context.Context, out *os.File) (Meta, error)

// Cache is a layer cache directory.
type Cache struct {
	dir string
	// alive reports whether a reference's pod still exists (liveRef).
	alive func(Ref) bool
	// lockPoll is how often a blocked lock is retried.
	lockPoll time.Duration
	// acct counts the layers in the node's image file system (nil: not
	// counted; imagefs.go).
	acct Accountant
}

// Open returns the cache in dir, creating the directory.
func Open(dir string) (*Cache, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("layer cache %q: not an absolute path (runtime.layer_cache_dir)", dir)
	}
	for _, d := range []string{dir, filepath.Join(dir, refsDir), filepath.Join(dir, locksDir), filepath.Join(dir, tmpDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("layer cache: %w (check runtime.layer_cache_dir)", err)
		}
	}
	return &Cache{dir: dir, alive: liveRef, lockPoll: 20 * time.Millisecond}, nil
}

// Dir is the cache's directory.
func (c *Cache) Dir() string { return c.dir }

// DiskPath is where the disk of diffID lies once cached.
func (c *Cache) DiskPath(diffID digest.Digest) string {
	return filepath.Join(c.dir, diffID.Encoded()+diskSuffix)
}

func (c *Cache) metaPath(hex string) string { return filepath.Join(c.dir, hex+metaSuffix) }
func (c *Cache) refDir(hex string) string   { return filepath.Join(c.dir, refsDir, hex) }

// checkDiffID accepts sha256 diff IDs only: their hex names the files.
func checkDiffID(d digest.Digest) error {
	if err := d.Validate(); err != nil || d.Algorithm() != digest.SHA256 {
		return fmt.Errorf("layer diff ID %q is not a sha256 digest", d)
	}
	return nil
}

// Acquire records ref's use of the layer diffID and returns its disk,
// building it with build when the cache does not hold it. built says
// whether this call built it. On error the reference is not recorded.
func (c *Cache) Acquire(ctx context.Context, diffID digest.Digest, ref Ref, build Builder) (_ Entry, built bool, retErr error) {
	if err := checkDiffID(diffID); err != nil {
		return Entry{}, false, err
	}
	if err := ref.check(); err != nil {
		return Entry{}, false, err
	}
	hex := diffID.Encoded()
	unlock, err := c.lock(ctx, hex)
	if err != nil {
		return Entry{}, false, err
	}
	defer unlock()
	if err := c.writeRef(hex, ref); err != nil {
		return Entry{}, false, err
	}
	defer func() {
		if retErr != nil {
			c.removeRef(hex, ref.Name)
		}
	}()
	e, err := c.lookup(hex)
	if err == nil {
		return e, false, nil
	}
	if !errors.Is(err, ErrNotCached) {
		return Entry{}, false, err
	}
	e, err = c.build(ctx, diffID, build)
	if err != nil {
		return Entry{}, false, err
	}
	c.account(ctx, e)
	return e, true, nil
}

// build converts the layer into tmp/ and renames it into place. The
// caller holds the layer's lock.
func (c *Cache) build(ctx context.Context, diffID digest.Digest, build Builder) (Entry, error) {
	hex := diffID.Encoded()
	// Whatever a crashed build left of this layer goes first.
	c.removeTemps(hex)
	for _, p := range []string{c.DiskPath(diffID), c.metaPath(hex)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return Entry{}, fmt.Errorf("layer cache: remove the incomplete entry of %s: %w", diffID, err)
		}
	}
	f, err := os.CreateTemp(filepath.Join(c.dir, tmpDir), hex+".*")
	if err != nil {
		return Entry{}, fmt.Errorf("layer cache: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	t0 := time.Now()
	m, err := build(ctx, f)
	if err != nil {
		return Entry{}, fmt.Errorf("build the disk of layer %s: %w", diffID, err)
	}
	if m.DiffID != diffID {
		return Entry{}, fmt.Errorf("layer %s: its blob %s unpacks to diff ID %s, not the %s the image config lists: refusing it (the content store holds a different layer than the image names; remove and pull the image again)",
			diffID, m.Source, m.DiffID, diffID)
	}
	if err := f.Sync(); err != nil {
		return Entry{}, fmt.Errorf("layer cache: sync the disk of %s: %w", diffID, err)
	}
	st, err := f.Stat()
	if err != nil {
		return Entry{}, err
	}
	if m.Size != 0 && m.Size != st.Size() {
		return Entry{}, fmt.Errorf("build the disk of layer %s: %d bytes written, %d reported", diffID, st.Size(), m.Size)
	}
	m.Size = st.Size()
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	m.BuildMillis = time.Since(t0).Milliseconds()
	if err := f.Chmod(0o444); err != nil {
		return Entry{}, err
	}
	if err := f.Close(); err != nil {
		return Entry{}, err
	}
	if err := c.writeMeta(hex, m); err != nil {
		return Entry{}, err
	}
	if err := os.Rename(tmp, c.DiskPath(diffID)); err != nil {
		os.Remove(c.metaPath(hex))
		return Entry{}, fmt.Errorf("layer cache: %w", err)
	}
	ok = true
	syncDir(c.dir)
	return Entry{Meta: m, Path: c.DiskPath(diffID)}, nil
}

func (c *Cache) writeMeta(hex string, m Meta) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Join(c.dir, tmpDir), hex+".*"+metaSuffix)
	if err != nil {
		return fmt.Errorf("layer cache: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("layer cache: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("layer cache: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), c.metaPath(hex)); err != nil {
		return fmt.Errorf("layer cache: %w", err)
	}
	return nil
}

// removeTemps removes what a build of the layer left in tmp/. The caller
// holds the layer's lock.
func (c *Cache) removeTemps(hex string) {
	left, _ := filepath.Glob(filepath.Join(c.dir, tmpDir, hex+".*"))
	for _, p := range left {
		os.Remove(p)
	}
}

// Lookup returns the cached disk of diffID, or ErrNotCached.
func (c *Cache) Lookup(diffID digest.Digest) (Entry, error) {
	if err := checkDiffID(diffID); err != nil {
		return Entry{}, err
	}
	return c.lookup(diffID.Encoded())
}

func (c *Cache) lookup(hex string) (Entry, error) {
	disk := filepath.Join(c.dir, hex+diskSuffix)
	st, err := os.Stat(disk)
	if errors.Is(err, fs.ErrNotExist) {
		return Entry{}, ErrNotCached
	}
	if err != nil {
		return Entry{}, fmt.Errorf("layer cache: %w", err)
	}
	data, err := os.ReadFile(c.metaPath(hex))
	if errors.Is(err, fs.ErrNotExist) {
		return Entry{}, ErrNotCached
	}
	if err != nil {
		return Entry{}, fmt.Errorf("layer cache: %w", err)
	}
	var m Meta
	if err := json.Unmarshal(data, &m); err != nil || m.DiffID.Encoded() != hex || m.Size != st.Size() {
		return Entry{}, ErrNotCached // incomplete or damaged: rebuilt
	}
	return Entry{Meta: m, Path: disk}, nil
}

// Release drops the reference named ref to the layer diffID. A missing
// reference is not an error.
func (c *Cache) Release(ctx context.Context, diffID digest.Digest, ref string) error {
	if err := checkDiffID(diffID); err != nil {
		return err
	}
	hex := diffID.Encoded()
	unlock, err := c.lock(ctx, hex)
	if err != nil {
		return err
	}
	defer unlock()
	return c.removeRef(hex, ref)
}

// ReleaseAll drops every reference named ref, as a pod torn down without
// its shim (shim delete) needs.
func (c *Cache) ReleaseAll(ctx context.Context, ref string) error {
	dirs, err := os.ReadDir(filepath.Join(c.dir, refsDir))
	if err != nil {
		return fmt.Errorf("layer cache: %w", err)
	}
	var errs []error
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(c.refDir(d.Name()), ref)); err != nil {
			continue
		}
		errs = append(errs, c.Release(ctx, digest.NewDigestFromEncoded(digest.SHA256, d.Name()), ref))
	}
	return errors.Join(errs...)
}

// syncDir makes renames in dir durable; failure only weakens that.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// isHexName reports whether name is 64 lower-case hex digits.
func isHexName(name string) bool {
	if len(name) != 64 {
		return false
	}
	return strings.Trim(name, "0123456789abcdef") == ""
}
