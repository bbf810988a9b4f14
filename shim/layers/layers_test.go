package layers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/ctrdimage"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// fakeImages is containerd with images whose layer blobs are their own
// "tar" (the fake converter's diff ID is the blob's digest).
type fakeImages struct {
	mu         sync.Mutex
	containers map[string]ctrdimage.Image // by container id
	blobs      map[digest.Digest][]byte
}

func newImages() *fakeImages {
	return &fakeImages{containers: map[string]ctrdimage.Image{}, blobs: map[digest.Digest][]byte{}}
}

// image makes an image of layers named by content.
func (f *fakeImages) image(name string, layers ...string) ctrdimage.Image {
	f.mu.Lock()
	defer f.mu.Unlock()
	im := ctrdimage.Image{Name: name}
	for _, l := range layers {
		data := []byte(strings.Repeat(l, 100))
		d := digest.FromBytes(data)
		f.blobs[d] = data
		im.Layers = append(im.Layers, ctrdimage.Layer{DiffID: d, Blob: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: d, Size: int64(len(data))}})
	}
	return im
}

func (f *fakeImages) run(id string, im ctrdimage.Image) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.containers[id] = im
}

func (f *fakeImages) ContainerImage(_ context.Context, id string) (ctrdimage.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	im, ok := f.containers[id]
	if !ok {
		return ctrdimage.Image{}, fmt.Errorf("container %s has no image: %w", id, ctrdimage.ErrNotImage)
	}
	return im, nil
}

func (f *fakeImages) HasBlob(_ context.Context, d digest.Digest) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.blobs[d]
	return ok, nil
}

func (f *fakeImages) OpenBlob(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, ok := f.blobs[desc.Digest]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}

// converter is a Converter that copies the blob as the disk, counting
// conversions; fail, when set, fails every one.
type converter struct {
	calls atomic.Int32
	fail  error
	// diffID, when set, is what every conversion reports.
	diffID digest.Digest
}

func (c *converter) convert(_ context.Context, blob io.Reader, _ string, out io.ReadWriteSeeker) (Info, error) {
	c.calls.Add(1)
	if c.fail != nil {
		return Info{}, c.fail
	}
	data, err := io.ReadAll(blob)
	if err != nil {
		return Info{}, err
	}
	if _, err := out.Write(data); err != nil {
		return Info{}, err
	}
	d := digest.FromBytes(data)
	if c.diffID != "" {
		d = c.diffID
	}
	return Info{DiffID: d, RootHash: d.Encoded(), DataBlocks: 1, Size: int64(len(data))}, nil
}

// machine is a pod VM's disk bus.
type machine struct {
	mu       sync.Mutex
	next     int
	attached map[string]vm.DiskAddress
	log      []string
}

func newMachine() *machine { return &machine{attached: map[string]vm.DiskAddress{}} }

func (m *machine) AttachDisk(_ context.Context, d vm.Disk) (vm.DiskAddress, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !d.ReadOnly {
		return vm.DiskAddress{}, fmt.Errorf("layer disk %s attached writable", d.ID)
	}
	if _, dup := m.attached[d.ID]; dup {
		return vm.DiskAddress{}, fmt.Errorf("disk %s attached twice", d.ID)
	}
	a := vm.DiskAddress{Target: m.next}
	m.next++
	m.attached[d.ID] = a
	m.log = append(m.log, "attach "+d.ID)
	return a, nil
}

func (m *machine) DetachDisk(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.attached[id]; !ok {
		return fmt.Errorf("disk %s not attached", id)
	}
	delete(m.attached, id)
	m.log = append(m.log, "detach "+id)
	return nil
}

func (m *machine) disks() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for id := range m.attached {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

type fixture struct {
	t      *testing.T
	cache  *layercache.Cache
	images *fakeImages
	conv   *converter
}

func newFixture(t *testing.T) *fixture {
	c, err := layercache.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, cache: c, images: newImages(), conv: &converter{}}
}

func (f *fixture) pod(name string) *Pod {
	ref, err := layercache.PodRef("test", name, "")
	if err != nil {
		f.t.Fatal(err)
	}
	return NewPod(f.cache, f.conv.convert, ref)
}

// refs returns the live references per layer.
func (f *fixture) refs() map[digest.Digest]int {
	f.t.Helper()
	ls, err := f.cache.List()
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[digest.Digest]int{}
	for _, l := range ls {
		if n := l.LiveRefs(); n > 0 {
			out[l.DiffID] = n
		}
	}
	return out
}

// start is Prepare and Attach of container id.
func start(t *testing.T, p *Pod, images Images, m Machine, id string) []*agent.Layer {
	t.Helper()
	ctx := context.Background()
	if _, err := p.Prepare(ctx, images, id); err != nil {
		t.Fatalf("Prepare %s: %v", id, err)
	}
	ls, err := p.Attach(ctx, m, id)
	if err != nil {
		t.Fatalf("Attach %s: %v", id, err)
	}
	return ls
}

// One pod, containers of images that share a base: each layer is
// attached once, detached with the last container using it.
func TestAttachOncePerPod(t *testing.T) {
	f := newFixture(t)
	app := f.images.image("app", "base", "app")
	tool := f.images.image("tool", "base", "tool")
	f.images.run("a1", app)
	f.images.run("a2", app)
	f.images.run("t1", tool)
	p, m := f.pod("pod"), newMachine()

	a1 := start(t, p, f.images, m, "a1")
	if len(a1) != 2 || a1[0].Digest != app.Layers[0].DiffID.String() || a1[1].Digest != app.Layers[1].DiffID.String() ||
		a1[0].RootHash != app.Layers[0].DiffID.Encoded() || a1[0].DataBlocks != 1 {
		t.Fatalf("layers of a1: %v", a1)
	}
	a2 := start(t, p, f.images, m, "a2")
	t1 := start(t, p, f.images, m, "t1")
	if len(m.log) != 3 {
		t.Fatalf("attachments %v, want base, app and tool once each", m.log)
	}
	if a2[0].Scsi.Target != a1[0].Scsi.Target || a2[1].Scsi.Target != a1[1].Scsi.Target || t1[0].Scsi.Target != a1[0].Scsi.Target {
		t.Fatalf("shared layers at different addresses: a1 %v a2 %v t1 %v", a1, a2, t1)
	}
	if f.conv.calls.Load() != 3 {
		t.Fatalf("%d conversions, want 3", f.conv.calls.Load())
	}
	if r := f.refs(); len(r) != 3 || r[app.Layers[0].DiffID] != 1 {
		t.Fatalf("cache references %v, want one per layer (one pod)", r)
	}

	ctx := context.Background()
	p.Release(ctx, m, "a1")
	if len(m.log) != 3 {
		t.Fatalf("a layer another container uses was detached: %v", m.log)
	}
	p.Release(ctx, m, "t1")
	if want := []string{DiskID(app.Layers[0].DiffID), DiskID(app.Layers[1].DiffID)}; !slices.Equal(m.disks(), sorted(want)) {
		t.Fatalf("after t1 went: attached %v, want %v", m.disks(), want)
	}
	if r := f.refs(); len(r) != 2 || r[tool.Layers[1].DiffID] != 0 {
		t.Fatalf("after t1 went: references %v", r)
	}
	p.Release(ctx, m, "a2")
	if len(m.disks()) != 0 || len(f.refs()) != 0 || len(p.Attached()) != 0 {
		t.Fatalf("after the last container: attached %v, references %v", m.disks(), f.refs())
	}
	// The disks stay cached for the next pod.
	if s, _ := layercache.Usage(f.cache.Dir()); s.Layers != 3 {
		t.Fatalf("cache after the pod: %+v", s)
	}
}

func sorted(s []string) []string { slices.Sort(s); return s }

// Pods share the cache: a layer is converted once for all of them.
func TestPodsShareTheCache(t *testing.T) {
	f := newFixture(t)
	app := f.images.image("app", "base", "app")
	f.images.run("c", app)
	var pods []*Pod
	for i := range 3 {
		p := f.pod(fmt.Sprint("pod-", i))
		start(t, p, f.images, newMachine(), "c")
		pods = append(pods, p)
	}
	if f.conv.calls.Load() != 2 {
		t.Fatalf("%d conversions for 3 pods of a 2-layer image, want 2", f.conv.calls.Load())
	}
	if r := f.refs(); r[app.Layers[0].DiffID] != 3 || r[app.Layers[1].DiffID] != 3 {
		t.Fatalf("references %v, want 3 per layer", r)
	}
	for _, p := range pods {
		p.Close(context.Background())
	}
	if r := f.refs(); len(r) != 0 {
		t.Fatalf("references after the pods closed: %v", r)
	}
}

// Containers of one pod created at once convert and attach each layer
// once.
func TestConcurrentContainers(t *testing.T) {
	f := newFixture(t)
	app := f.images.image("app", "l1", "l2", "l3", "l4")
	for i := range 6 {
		f.images.run(fmt.Sprint("c", i), app)
	}
	p, m := f.pod("pod"), newMachine()
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprint("c", i)
			if _, err := p.Prepare(context.Background(), f.images, id); err != nil {
				errs <- err
				return
			}
			_, err := p.Attach(context.Background(), m, id)
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
	if f.conv.calls.Load() != 4 || len(m.log) != 4 {
		t.Fatalf("%d conversions and attachments %v, want 4 each", f.conv.calls.Load(), m.log)
	}
	// Removed at once too: each detached once, all references gone.
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Release(context.Background(), m, fmt.Sprint("c", i))
		}()
	}
	wg.Wait()
	if len(m.disks()) != 0 || len(m.log) != 8 || len(f.refs()) != 0 {
		t.Fatalf("after removing all: attached %v, log %v, references %v", m.disks(), m.log, f.refs())
	}
}

func TestUnavailable(t *testing.T) {
	f := newFixture(t)
	app := f.images.image("app", "base", "app")
	f.images.run("c", app)
	p := f.pod("pod")
	ctx := context.Background()
	// No image in containerd (ctr run --rootfs, a snapshot of another
	// parent).
	if _, err := p.Prepare(ctx, f.images, "no-image"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a container without an image: %v, want ErrUnavailable", err)
	}
	// A layer blob discarded after unpacking, and not cached.
	f.images.mu.Lock()
	delete(f.images.blobs, app.Layers[1].Blob.Digest)
	f.images.mu.Unlock()
	_, err := p.Prepare(ctx, f.images, "c")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), app.Layers[1].DiffID.String()) || !strings.Contains(err.Error(), "discard_unpacked_layers") {
		t.Fatalf("a discarded blob: %v, want ErrUnavailable naming the layer and discard_unpacked_layers", err)
	}
	if f.conv.calls.Load() != 0 || len(f.refs()) != 0 {
		t.Fatalf("an unavailable image converted %d layers, left references %v", f.conv.calls.Load(), f.refs())
	}
	// Once the layer is cached, its blob is not needed.
	other := f.pod("other")
	f.images.mu.Lock()
	f.images.blobs[app.Layers[1].Blob.Digest] = []byte(strings.Repeat("app", 100))
	f.images.mu.Unlock()
	start(t, other, f.images, newMachine(), "c")
	f.images.mu.Lock()
	delete(f.images.blobs, app.Layers[1].Blob.Digest)
	f.images.mu.Unlock()
	start(t, p, f.images, newMachine(), "c")
}

// A failed conversion leaves the container nothing: no reference, no
// disk, and the layers it had acquired are released.
func TestFailedConversion(t *testing.T) {
	f := newFixture(t)
	app := f.images.image("app", "base", "app")
	f.images.run("c", app)
	f.conv.fail = errors.New("gzip: invalid header")
	p := f.pod("pod")
	_, err := p.Prepare(context.Background(), f.images, "c")
	if err == nil || !strings.Contains(err.Error(), "gzip: invalid header") {
		t.Fatalf("Prepare with a failing conversion: %v", err)
	}
	if len(f.refs()) != 0 || len(p.Attached()) != 0 {
		t.Fatalf("after a failed Prepare: references %v", f.refs())
	}
	if _, err := p.Attach(context.Background(), newMachine(), "c"); err == nil {
		t.Fatal("Attach of a container whose Prepare failed succeeded")
	}
	// The same container can be prepared again once the cause is gone.
	f.conv.fail = nil
	start(t, p, f.images, newMachine(), "c")
}

// A blob that does not unpack to the diff ID the image config names is
// refused, naming the layer.
func TestDiffIDMismatch(t *testing.T) {
	f := newFixture(t)
	app := f.images.image("app", "base")
	f.images.run("c", app)
	f.conv.diffID = digest.FromString("another layer")
	_, err := f.pod("pod").Prepare(context.Background(), f.images, "c")
	if err == nil || !strings.Contains(err.Error(), app.Layers[0].DiffID.String()) || !strings.Contains(err.Error(), "refusing") {
		t.Fatalf("a blob of another diff ID: %v", err)
	}
	if s, _ := layercache.Usage(f.cache.Dir()); s.Layers != 0 {
		t.Fatalf("the mismatched layer was cached: %+v", s)
	}
}

// Prepare's disks are those Attach attaches: the service boots the
// pod's VM with the first container's.
func TestPrepareReturnsReadOnlyDisks(t *testing.T) {
	f := newFixture(t)
	app := f.images.image("app", "base", "app")
	f.images.run("c", app)
	disks, err := f.pod("pod").Prepare(context.Background(), f.images, "c")
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range disks {
		data, err := os.ReadFile(d.Path)
		if !d.ReadOnly || d.ID != DiskID(app.Layers[i].DiffID) || err != nil || digest.FromBytes(data) != app.Layers[i].DiffID {
			t.Errorf("disk %d: %+v (%v)", i, d, err)
		}
	}
}
