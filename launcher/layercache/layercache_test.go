package layercache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// layerBytes is the fake disk of a layer: the test's builder writes it.
func layerBytes(d digest.Digest) []byte {
	return bytes.Repeat([]byte(d.Encoded()[:8]), 1024)
}

func diffID(n int) digest.Digest { return digest.FromString(fmt.Sprintf("layer-%d", n)) }

// builder returns a Builder writing layerBytes(d), counting its calls.
func builder(d digest.Digest, calls *atomic.Int32) Builder {
	return func(ctx context.Context, out *os.File) (Meta, error) {
		calls.Add(1)
		time.Sleep(20 * time.Millisecond) // long enough for racers to meet
		data := layerBytes(d)
		if _, err := out.Write(data); err != nil {
			return Meta{}, err
		}
		return Meta{DiffID: d, RootHash: strings.Repeat("ab", 32), DataBlocks: 2, Size: int64(len(data)), Source: digest.FromString("blob")}, nil
	}
}

func ref(name string) Ref { return Ref{Name: name, Namespace: "ns", Pod: name, PID: -1} }

// openCache returns a cache in dir whose references are live unless named
// in dead.
func openCache(t *testing.T, dir string, dead ...string) *Cache {
	t.Helper()
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	c.lockPoll = time.Millisecond
	c.alive = func(r Ref) bool {
		for _, d := range dead {
			if r.Name == d {
				return false
			}
		}
		return true
	}
	return c
}

func TestAcquireBuildsOnceAndSharesTheDisk(t *testing.T) {
	c := openCache(t, t.TempDir())
	ctx := context.Background()
	d := diffID(1)
	var calls atomic.Int32
	e1, built, err := c.Acquire(ctx, d, ref("pod-a"), builder(d, &calls))
	if err != nil || !built {
		t.Fatalf("first Acquire: built %v, %v", built, err)
	}
	e2, built, err := c.Acquire(ctx, d, ref("pod-b"), builder(d, &calls))
	if err != nil || built {
		t.Fatalf("second Acquire: built %v, %v", built, err)
	}
	if calls.Load() != 1 || e1.Path != e2.Path || e2.RootHash != strings.Repeat("ab", 32) || e2.DataBlocks != 2 {
		t.Fatalf("builds %d, entries %+v %+v", calls.Load(), e1, e2)
	}
	data, err := os.ReadFile(e1.Path)
	if err != nil || !bytes.Equal(data, layerBytes(d)) {
		t.Fatalf("disk %s: %v", e1.Path, err)
	}
	st, _ := os.Stat(e1.Path)
	if st.Mode().Perm() != 0o444 {
		t.Errorf("disk mode %v, want read-only", st.Mode())
	}
	layers, err := c.List()
	if err != nil || len(layers) != 1 || len(layers[0].Refs) != 2 || layers[0].LiveRefs() != 2 {
		t.Fatalf("List: %+v, %v", layers, err)
	}
	if left, _ := os.ReadDir(filepath.Join(c.Dir(), tmpDir)); len(left) != 0 {
		t.Errorf("tmp/ holds %v after the build", left)
	}
	s, err := Usage(c.Dir())
	if err != nil || s.Layers != 1 || s.Bytes != int64(len(layerBytes(d))) || s.Allocated == 0 {
		t.Fatalf("Usage = %+v, %v", s, err)
	}
}

// Shims are separate processes: one Cache each, on one directory. However
// many ask at once, the layer is converted once.
func TestConcurrentAcquireConvertsOnce(t *testing.T) {
	dir := t.TempDir()
	d := diffID(2)
	var calls atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := openCache(t, dir)
			e, _, err := c.Acquire(context.Background(), d, ref(fmt.Sprintf("pod-%d", i)), builder(d, &calls))
			if err == nil {
				if data, rerr := os.ReadFile(e.Path); rerr != nil || !bytes.Equal(data, layerBytes(d)) {
					err = fmt.Errorf("disk after Acquire: %v", rerr)
				}
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("layer converted %d times, want once", calls.Load())
	}
}

// The same across real processes: flock, not an in-process mutex, keeps
// two shims from converting one layer twice.
func TestAcquireAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	marks := filepath.Join(dir, "marks")
	if err := os.Mkdir(marks, 0o700); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for i := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "LAYERCACHE_HELPER_DIR="+dir, fmt.Sprintf("LAYERCACHE_HELPER_N=%d", i))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("helper %d:\n%s", i, out.String())
			}
		})
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper: %v", err)
		}
	}
	built, _ := os.ReadDir(marks)
	if len(built) != 1 {
		t.Fatalf("%d processes converted the layer, want 1", len(built))
	}
	c := openCache(t, filepath.Join(dir, "cache"))
	if layers, err := c.List(); err != nil || len(layers) != 1 || len(layers[0].Refs) != 3 {
		t.Fatalf("List: %+v, %v", layers, err)
	}
}

// TestMain runs the helpers of TestAcquireAcrossProcesses when asked to.
func TestMain(m *testing.M) {
	if dir := os.Getenv("LAYERCACHE_HELPER_DIR"); dir != "" {
		if err := helperAcquire(dir, os.Getenv("LAYERCACHE_HELPER_N")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperAcquire is one process of TestAcquireAcrossProcesses: it acquires
// the layer, marking that it built it.
func helperAcquire(dir, n string) error {
	c, err := Open(filepath.Join(dir, "cache"))
	if err != nil {
		return err
	}
	c.alive = func(Ref) bool { return true }
	d := diffID(3)
	var calls atomic.Int32
	b := builder(d, &calls)
	_, _, err = c.Acquire(context.Background(), d, ref("pod-"+n), func(ctx context.Context, out *os.File) (Meta, error) {
		if err := os.WriteFile(filepath.Join(dir, "marks", n), nil, 0o600); err != nil {
			return Meta{}, err
		}
		time.Sleep(100 * time.Millisecond)
		return b(ctx, out)
	})
	return err
}

func TestFailedBuildLeavesNothing(t *testing.T) {
	c := openCache(t, t.TempDir())
	d := diffID(4)
	boom := errors.New("blob truncated")
	_, _, err := c.Acquire(context.Background(), d, ref("pod-a"), func(ctx context.Context, out *os.File) (Meta, error) {
		out.Write([]byte("half a disk"))
		return Meta{}, boom
	})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), d.String()) {
		t.Fatalf("Acquire with a failing build: %v, want the build's error naming the layer", err)
	}
	assertEmpty(t, c)
}

// A blob whose tar is not the layer the image config names is refused by
// name, and nothing of it is cached.
func TestDiffIDMismatchIsRefused(t *testing.T) {
	c := openCache(t, t.TempDir())
	want, got := diffID(5), diffID(6)
	var calls atomic.Int32
	_, _, err := c.Acquire(context.Background(), want, ref("pod-a"), builder(got, &calls))
	if err == nil || !strings.Contains(err.Error(), want.String()) || !strings.Contains(err.Error(), got.String()) {
		t.Fatalf("Acquire of a mismatched blob: %v, want a refusal naming both diff IDs", err)
	}
	assertEmpty(t, c)
}

// assertEmpty checks that the cache holds no disk, meta, reference or
// temporary file.
func assertEmpty(t *testing.T, c *Cache) {
	t.Helper()
	var left []string
	filepath.Walk(c.Dir(), func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && filepath.Dir(p) != filepath.Join(c.Dir(), locksDir) {
			left = append(left, strings.TrimPrefix(p, c.Dir()))
		}
		return nil
	})
	if len(left) > 0 {
		t.Fatalf("left in the cache: %v", left)
	}
	if _, err := c.Lookup(diffID(4)); !errors.Is(err, ErrNotCached) {
		t.Fatalf("Lookup: %v", err)
	}
}

// What a crash leaves (a partial disk in tmp/, a meta without its disk, a
// disk without its meta) is never taken for a layer: the next Acquire
// rebuilds it.
func TestCrashLeftoversAreRebuilt(t *testing.T) {
	c := openCache(t, t.TempDir())
	d := diffID(7)
	hex := d.Encoded()
	for _, leftover := range []func(){
		func() { os.WriteFile(filepath.Join(c.Dir(), tmpDir, hex+".123"), []byte("partial"), 0o600) },
		func() { c.writeMeta(hex, Meta{DiffID: d, Size: 8192}) },
		func() { os.WriteFile(c.DiskPath(d), []byte("partial"), 0o444) },
		func() {
			os.WriteFile(c.DiskPath(d), []byte("partial"), 0o444)
			c.writeMeta(hex, Meta{DiffID: d, Size: int64(len(layerBytes(d)))})
		},
	} {
		os.Remove(c.DiskPath(d))
		os.Remove(c.metaPath(hex))
		leftover()
		if _, err := c.Lookup(d); !errors.Is(err, ErrNotCached) {
			t.Fatalf("Lookup after a crash: %v, want ErrNotCached", err)
		}
		var calls atomic.Int32
		e, built, err := c.Acquire(context.Background(), d, ref("pod"), builder(d, &calls))
		if err != nil || !built {
			t.Fatalf("Acquire after a crash: built %v, %v", built, err)
		}
		if data, _ := os.ReadFile(e.Path); !bytes.Equal(data, layerBytes(d)) {
			t.Fatal("the rebuilt disk is not the layer")
		}
		if left, _ := filepath.Glob(filepath.Join(c.Dir(), tmpDir, "*")); len(left) != 0 {
			t.Fatalf("tmp/ after the rebuild: %v", left)
		}
	}
}

func TestPrune(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, "gone")
	ctx := context.Background()
	var calls atomic.Int32
	used, stale, image, free := diffID(10), diffID(11), diffID(12), diffID(13)
	for d, r := range map[digest.Digest]string{used: "running", stale: "gone", image: "gone", free: "released"} {
		if _, _, err := c.Acquire(ctx, d, ref(r), builder(d, &calls)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Release(ctx, free, "released"); err != nil {
		t.Fatal(err)
	}
	inImage := func(d digest.Digest) bool { return d == image }
	p, err := c.Prune(ctx, inImage)
	if err != nil {
		t.Fatal(err)
	}
	removed := map[digest.Digest]bool{}
	for _, e := range p.Layers {
		removed[e.DiffID] = true
		if _, err := os.Stat(e.Path); !os.IsNotExist(err) {
			t.Errorf("pruned disk %s still exists", e.Path)
		}
	}
	if len(removed) != 2 || !removed[stale] || !removed[free] || p.StaleRefs != 2 || p.Bytes == 0 {
		t.Fatalf("Prune removed %v (stale refs %d, %d bytes), want %s and %s", removed, p.StaleRefs, p.Bytes, stale, free)
	}
	for _, d := range []digest.Digest{used, image} {
		if _, err := c.Lookup(d); err != nil {
			t.Errorf("Prune removed %s: %v", d, err)
		}
	}
	// Ignoring the image store (--all-unused), only the running pod's
	// layer stays.
	if p, err = c.Prune(ctx, nil); err != nil || len(p.Layers) != 1 || p.Layers[0].DiffID != image {
		t.Fatalf("Prune --all-unused: %+v, %v", p, err)
	}
	if _, err := c.Lookup(used); err != nil {
		t.Fatalf("Prune removed the running pod's layer: %v", err)
	}
	// Once released, it goes too, with every file of it.
	if err := c.ReleaseAll(ctx, "running"); err != nil {
		t.Fatal(err)
	}
	if p, err = c.Prune(ctx, nil); err != nil || len(p.Layers) != 1 {
		t.Fatalf("Prune after release: %+v, %v", p, err)
	}
	for _, sub := range []string{"", refsDir, locksDir, tmpDir} {
		if ents, _ := os.ReadDir(filepath.Join(dir, sub)); len(ents) != map[string]int{"": 3}[sub] {
			t.Errorf("%s/ after pruning everything: %v", sub, ents)
		}
	}
}

// Prune running against pods acquiring and releasing a layer never
// removes the disk while a pod holds it: a pod's reference is recorded
// under the layer's lock before Acquire returns.
func TestPruneNeverRemovesAHeldLayer(t *testing.T) {
	dir := t.TempDir()
	d := diffID(20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pr := openCache(t, dir)
		for ctx.Err() == nil {
			if _, err := pr.Prune(ctx, nil); err != nil && ctx.Err() == nil {
				t.Errorf("Prune: %v", err)
				return
			}
		}
	}()
	var calls atomic.Int32
	for i := 0; ctx.Err() == nil; i++ {
		c := openCache(t, dir)
		r := ref(fmt.Sprintf("pod-%d", i%3))
		e, _, err := c.Acquire(ctx, d, r, builder(d, &calls))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			t.Fatal(err)
		}
		// Held: the disk stays, whole.
		time.Sleep(time.Millisecond)
		if data, err := os.ReadFile(e.Path); err != nil || !bytes.Equal(data, layerBytes(d)) {
			t.Fatalf("round %d: the disk of a held layer: %v", i, err)
		}
		if err := c.Release(context.Background(), d, r.Name); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // Prune's turn
	}
	wg.Wait()
	if calls.Load() < 2 {
		t.Fatalf("the layer was built %d times: Prune never removed it, so the test proved nothing", calls.Load())
	}
}

func TestLiveRef(t *testing.T) {
	r, err := PodRef("k8s.io", "pod-1", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !liveRef(r) {
		t.Fatal("this process's reference is not live")
	}
	other, _ := PodRef("k8s.io", "pod-2", "")
	if other.Name == r.Name || len(r.Name) != 24 {
		t.Fatalf("reference names %q and %q", r.Name, other.Name)
	}
	r.Start++ // a reused pid
	if liveRef(r) {
		t.Fatal("a reference of another process with this pid is live")
	}
	// A dead shim whose QEMU still runs keeps its reference (here: a
	// pid file naming a process that is not QEMU does not).
	os.WriteFile(filepath.Join(r.StateDir, statedir.PidFile), []byte(fmt.Sprint(os.Getpid())), 0o600)
	if liveRef(r) {
		t.Fatal("a pid file naming a process that is not QEMU keeps the reference")
	}
}
