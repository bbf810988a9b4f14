package layercache

import (
	"context"
	"errors"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
)

// fakeAccountant counts layers in memory, as containerd's image file
// system would, and checks the cache's order: a layer is counted only
// while its disk exists.
type fakeAccountant struct {
	t       *testing.T
	mu      sync.Mutex
	counted map[digest.Digest]bool
	adds    int
	failAdd error
	failRm  error
	noFS    bool
}

func newFakeAccountant(t *testing.T) *fakeAccountant {
	return &fakeAccountant{t: t, counted: map[digest.Digest]bool{}}
}

func (f *fakeAccountant) Add(ctx context.Context, e Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noFS {
		return ErrNoImageFS
	}
	if f.failAdd != nil {
		return f.failAdd
	}
	if _, err := os.Stat(e.Path); err != nil {
		f.t.Errorf("Add(%s) without its disk: %v", e.DiffID, err)
	}
	f.adds++
	f.counted[e.DiffID] = true
	return nil
}

func (f *fakeAccountant) Remove(ctx context.Context, d digest.Digest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRm != nil {
		return f.failRm
	}
	delete(f.counted, d)
	return nil
}

func (f *fakeAccountant) Counted(ctx context.Context) ([]digest.Digest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []digest.Digest
	for d := range f.counted {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

func (f *fakeAccountant) is(d digest.Digest) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counted[d]
}

// A layer is counted once, when built; a failure to count it does not
// fail its pod.
func TestAcquireCountsTheBuiltLayer(t *testing.T) {
	c := openCache(t, t.TempDir())
	a := newFakeAccountant(t)
	c.Account(a)
	ctx := context.Background()
	var calls atomic.Int32
	d := diffID(30)
	for _, pod := range []string{"pod-a", "pod-b"} {
		if _, _, err := c.Acquire(ctx, d, ref(pod), builder(d, &calls)); err != nil {
			t.Fatal(err)
		}
	}
	if !a.is(d) || a.adds != 1 {
		t.Fatalf("counted %v after %d adds, want once", a.is(d), a.adds)
	}
	a.failAdd = errors.New("containerd is down")
	d2 := diffID(31)
	if _, built, err := c.Acquire(ctx, d2, ref("pod-a"), builder(d2, &calls)); err != nil || !built {
		t.Fatalf("Acquire while counting fails: built %v, %v", built, err)
	}
	if a.is(d2) {
		t.Fatal("counted although Add failed")
	}
}

// Prune stops counting a layer before removing its disk, never for a
// layer a pod holds, and keeps a layer whose count it cannot remove (the
// count's hard link would keep its blocks anyway).
func TestPruneUncountsFirst(t *testing.T) {
	c := openCache(t, t.TempDir())
	a := newFakeAccountant(t)
	c.Account(a)
	ctx := context.Background()
	var calls atomic.Int32
	held, free := diffID(32), diffID(33)
	for d, r := range map[digest.Digest]string{held: "running", free: "released"} {
		if _, _, err := c.Acquire(ctx, d, ref(r), builder(d, &calls)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Release(ctx, free, "released"); err != nil {
		t.Fatal(err)
	}

	a.failRm = errors.New("containerd is down")
	if _, err := c.Prune(ctx, nil); err == nil {
		t.Fatal("Prune succeeded although the layer's count could not be removed")
	}
	if _, err := c.Lookup(free); err != nil || !a.is(free) {
		t.Fatalf("a layer whose count stays was removed: %v", err)
	}

	a.failRm = nil
	p, err := c.Prune(ctx, nil)
	if err != nil || len(p.Layers) != 1 || p.Layers[0].DiffID != free {
		t.Fatalf("Prune: %+v, %v", p, err)
	}
	if a.is(free) {
		t.Fatal("the pruned layer is still counted")
	}
	if _, err := c.Lookup(held); err != nil || !a.is(held) {
		t.Fatalf("the held layer: cached %v, counted %v", err, a.is(held))
	}

	// Released, it goes, count and all.
	if err := c.Release(ctx, held, "running"); err != nil {
		t.Fatal(err)
	}
	if p, err := c.Prune(ctx, nil); err != nil || len(p.Layers) != 1 || a.is(held) {
		t.Fatalf("Prune after release: %+v, %v, counted %v", p, err, a.is(held))
	}
}

// SyncAccounts counts what a cache holds uncounted (built before
// accounting, or while containerd was away) and drops counts of layers
// gone.
func TestSyncAccounts(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir)
	ctx := context.Background()
	var calls atomic.Int32
	old, gone := diffID(34), diffID(35)
	if _, _, err := c.Acquire(ctx, old, ref("pod"), builder(old, &calls)); err != nil {
		t.Fatal(err)
	}
	a := newFakeAccountant(t)
	a.counted[gone] = true
	c.Account(a)
	s, err := c.SyncAccounts(ctx)
	if err != nil || len(s.Added) != 1 || s.Added[0] != old || len(s.Removed) != 1 || s.Removed[0] != gone {
		t.Fatalf("SyncAccounts = %+v, %v", s, err)
	}
	if !a.is(old) || a.is(gone) {
		t.Fatalf("counted: %v", a.counted)
	}
	if s, err := c.SyncAccounts(ctx); err != nil || len(s.Added)+len(s.Removed) != 0 {
		t.Fatalf("second SyncAccounts = %+v, %v", s, err)
	}

	// A containerd without CRI: nothing to count, and said so.
	b := newFakeAccountant(t)
	b.noFS = true
	c.Account(b)
	if _, err := c.SyncAccounts(ctx); !errors.Is(err, ErrNoImageFS) {
		t.Fatalf("SyncAccounts without an image file system: %v", err)
	}
	// No accountant: nothing.
	c.Account(nil)
	if s, err := c.SyncAccounts(ctx); err != nil || len(s.Added)+len(s.Removed) != 0 {
		t.Fatalf("SyncAccounts without an accountant = %+v, %v", s, err)
	}
}
