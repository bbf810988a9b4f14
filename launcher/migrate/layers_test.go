package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// fakeBlobs is a content store of one namespace.
type fakeBlobs struct {
	ns    string
	blobs map[digest.Digest][]byte
	opens int
}

func (b *fakeBlobs) OpenBlob(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if ns, _ := namespaces.Namespace(ctx); ns != b.ns {
		return nil, errors.New("not found in namespace " + ns)
	}
	data, ok := b.blobs[desc.Digest]
	if !ok {
		return nil, errors.New("blob " + desc.Digest.String() + " not found")
	}
	b.opens++
	return io.NopCloser(bytes.NewReader(data)), nil
}

// fakeConvert "converts" a blob into a disk of its bytes: its diff ID is
// the blob's digest and its root that digest's hex, as the layers the
// tests describe.
func fakeConvert(_ context.Context, blob io.Reader, _ string, out *os.File) (LayerInfo, error) {
	data, err := io.ReadAll(blob)
	if err != nil {
		return LayerInfo{}, err
	}
	if _, err := out.Write(data); err != nil {
		return LayerInfo{}, err
	}
	d := digest.FromBytes(data)
	return LayerInfo{DiffID: d, RootHash: d.Encoded(), DataBlocks: 1, Size: int64(len(data))}, nil
}

// testLayer is a layer whose blob is data, as the source describes it.
func testLayer(data string) (Layer, []byte) {
	d := digest.FromString(data)
	return Layer{Disk: "layer-" + d.Encoded()[:24], DiffID: d, RootHash: d.Encoded(), DataBlocks: 1, Blob: d, MediaType: ocispec.MediaTypeImageLayer}, []byte(data)
}

// liveIncomingRefs counts the references of incoming VMs per layer.
func liveIncomingRefs(t *testing.T, c *layercache.Cache) map[digest.Digest]int {
	t.Helper()
	ls, err := c.List()
	if err != nil {
		t.Fatal(err)
	}
	out := map[digest.Digest]int{}
	for _, l := range ls {
		for _, r := range l.Refs {
			if r.Live && strings.HasPrefix(r.Name, "in-") {
				out[l.DiffID]++
			}
		}
	}
	return out
}

// The destination gives an incoming VM its own copy of each layer disk
// the VM brings, at the VM's SCSI target: converted from its content
// store when its cache lacks the layer, with a reference on it until the
// VM is stopped; disks that are not layers still come from shared
// storage. QEMU gets the same -device and -blockdev arguments as on the
// source but for the files.
func TestIncomingLayers(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	if err := os.MkdirAll(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(shared, "scratch.img")
	if err := os.WriteFile(scratch, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cache, err := layercache.Open(filepath.Join(root, "b-layers"))
	if err != nil {
		t.Fatal(err)
	}
	base, baseData := testLayer("base layer")
	app, appData := testLayer("app layer")
	blobs := &fakeBlobs{ns: "k8s.io", blobs: map[digest.Digest][]byte{base.Blob: baseData, app.Blob: appData}}
	store := &CacheLayers{Cache: cache, Dir: cache.Dir(), Blobs: blobs, Convert: fakeConvert}
	srcDisks := []vm.Disk{
		{ID: base.Disk, Path: "/var/lib/c8s/layers/a.disk", ReadOnly: true},
		{ID: "scratch", Path: scratch},
		{ID: app.Disk, Path: "/var/lib/c8s/layers/b.disk", ReadOnly: true},
	}
	req := IncomingRequest{ID: "pod1", Namespace: "k8s.io", Disks: srcDisks, Layers: []Layer{app, base}}
	stores := func() (LayerStore, error) { return store, nil }
	ctx := context.Background()

	disks, release, code, err := incomingDisks(ctx, req, shared, stores, filepath.Join(root, "b", "pod1"))
	if err != nil {
		t.Fatalf("incomingDisks = %d, %v", code, err)
	}
	want := []vm.Disk{
		{ID: base.Disk, Path: cache.DiskPath(base.DiffID), ReadOnly: true},
		{ID: "scratch", Path: scratch},
		{ID: app.Disk, Path: cache.DiskPath(app.DiffID), ReadOnly: true},
	}
	if !reflect.DeepEqual(disks, want) {
		t.Fatalf("destination disks\n%+v\nwant\n%+v", disks, want)
	}
	if blobs.opens != 2 {
		t.Fatalf("%d blobs converted, want 2", blobs.opens)
	}
	if r := liveIncomingRefs(t, cache); len(r) != 2 || r[base.DiffID] != 1 || r[app.DiffID] != 1 {
		t.Fatalf("the destination's references: %v, want the VM on both layers", r)
	}
	sameQEMUDevices(t, srcDisks, disks)

	// A second VM of the same layers converts nothing.
	req2 := req
	req2.ID = "pod2"
	_, release2, _, err := incomingDisks(ctx, req2, shared, stores, filepath.Join(root, "b", "pod2"))
	if err != nil || blobs.opens != 2 {
		t.Fatalf("second VM: %v, %d conversions", err, blobs.opens)
	}
	if r := liveIncomingRefs(t, cache); r[base.DiffID] != 2 {
		t.Fatalf("references with two VMs: %v", r)
	}
	release(ctx)
	release2(ctx)
	if r := liveIncomingRefs(t, cache); len(r) != 0 {
		t.Fatalf("references after both VMs stopped: %v", r)
	}
	if p, err := cache.Prune(ctx, nil); err != nil || len(p.Layers) != 2 {
		t.Fatalf("prune after the VMs: %+v, %v; want both layers removed", p, err)
	}
}

// sameQEMUDevices checks that QEMU on the destination gets the source's
// -device and -blockdev arguments, the files aside.
func sameQEMUDevices(t *testing.T, src, dst []vm.Disk) {
	t.Helper()
	args := func(disks []vm.Disk) (devices, blockdevs []string) {
		h := config.Default().Hypervisor
		h.Kernel, h.Initrd, h.TEE = "/k", "/i", "sim"
		argv, err := vm.Args(vm.Spec{ID: "pod1", StateDir: "/run/c8s/pod1", Hypervisor: h, Accel: "tcg", Disks: disks}, sim.Backend{})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(argv); i++ {
			switch argv[i] {
			case "-device":
				devices = append(devices, argv[i+1])
			case "-blockdev":
				var bd map[string]any
				if err := json.Unmarshal([]byte(argv[i+1]), &bd); err != nil {
					t.Fatal(err)
				}
				delete(bd["file"].(map[string]any), "filename")
				b, _ := json.Marshal(bd)
				blockdevs = append(blockdevs, string(b))
			}
		}
		return devices, blockdevs
	}
	sd, sb := args(src)
	dd, db := args(dst)
	if len(sb) != len(src) || !reflect.DeepEqual(sd, dd) || !reflect.DeepEqual(sb, db) {
		t.Fatalf("QEMU devices differ:\nsource      %q\n            %q\ndestination %q\n            %q", sd, sb, dd, db)
	}
}

// The destination refuses, before any QEMU starts and naming the layer, a
// layer whose disk here has another dm-verity root than the source's, one
// it cannot find or convert, and a request whose layers and disks
// disagree; no reference is left behind.
func TestIncomingLayerRefusals(t *testing.T) {
	root := t.TempDir()
	cache, err := layercache.Open(filepath.Join(root, "b-layers"))
	if err != nil {
		t.Fatal(err)
	}
	base, baseData := testLayer("base layer")
	app, appData := testLayer("app layer")
	ctx := context.Background()
	stateDir := filepath.Join(root, "b", "pod1")
	disks := []vm.Disk{{ID: base.Disk, Path: "/x/a.disk", ReadOnly: true}, {ID: app.Disk, Path: "/x/b.disk", ReadOnly: true}}

	// This node converted app's layer into a disk with another root (an
	// older c8s): the source's guest opened it with the source's root.
	other, err := layercache.IncomingRef("other", stateDir)
	if err != nil {
		t.Fatal(err)
	}
	other.Name = "other"
	if _, _, err := cache.Acquire(ctx, app.DiffID, other, func(_ context.Context, out *os.File) (layercache.Meta, error) {
		out.Write(appData)
		return layercache.Meta{DiffID: app.DiffID, RootHash: strings.Repeat("0", 64), DataBlocks: 1}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := cache.Release(ctx, app.DiffID, "other"); err != nil {
		t.Fatal(err)
	}
	blobs := &fakeBlobs{ns: "k8s.io", blobs: map[digest.Digest][]byte{base.Blob: baseData, app.Blob: appData}}
	store := &CacheLayers{Cache: cache, Dir: cache.Dir(), Blobs: blobs, Convert: fakeConvert}
	stores := func() (LayerStore, error) { return store, nil }
	req := IncomingRequest{ID: "pod1", Namespace: "k8s.io", Disks: disks, Layers: []Layer{base, app}}
	_, _, code, err := incomingDisks(ctx, req, "", stores, stateDir)
	if code != 409 || err == nil || !strings.Contains(err.Error(), "layer "+app.DiffID.String()) ||
		!strings.Contains(err.Error(), "dm-verity root "+strings.Repeat("0", 64)) || !strings.Contains(err.Error(), "the source's "+app.RootHash) {
		t.Fatalf("a layer with another root = %d, %v; want 409 naming the layer and both roots", code, err)
	}
	if r := liveIncomingRefs(t, cache); len(r) != 0 {
		t.Fatalf("references left by the refusal: %v", r)
	}

	// Not cached, and no containerd to convert from.
	cache2, err := layercache.Open(filepath.Join(root, "c-layers"))
	if err != nil {
		t.Fatal(err)
	}
	bare := func() (LayerStore, error) { return &CacheLayers{Cache: cache2, Dir: cache2.Dir()}, nil }
	_, _, code, err = incomingDisks(ctx, req, "", bare, stateDir)
	if code != 409 || err == nil || !strings.Contains(err.Error(), "layer "+base.DiffID.String()) || !strings.Contains(err.Error(), "--containerd") {
		t.Fatalf("a layer this node lacks = %d, %v; want 409 naming the layer and the way out", code, err)
	}
	// Its blob is in another namespace than the pod's.
	req.Namespace = "default"
	_, _, code, err = incomingDisks(ctx, req, "", func() (LayerStore, error) {
		return &CacheLayers{Cache: cache2, Dir: cache2.Dir(), Blobs: blobs, Convert: fakeConvert}, nil
	}, stateDir)
	if code != 409 || err == nil || !strings.Contains(err.Error(), base.DiffID.String()) || !strings.Contains(err.Error(), `namespace "default"`) {
		t.Fatalf("a blob outside the pod's namespace = %d, %v", code, err)
	}
	if r := liveIncomingRefs(t, cache2); len(r) != 0 {
		t.Fatalf("references left: %v", r)
	}

	// Layers and disks that disagree.
	bad := IncomingRequest{ID: "pod1", Disks: disks[:1], Layers: []Layer{base, app}}
	if _, _, code, err := incomingDisks(ctx, bad, "", stores, stateDir); code != 400 || err == nil || !strings.Contains(err.Error(), app.Disk) {
		t.Fatalf("a layer naming no disk = %d, %v", code, err)
	}
	bad = IncomingRequest{ID: "pod1", Disks: disks, Layers: []Layer{base, base}}
	if _, _, code, err := incomingDisks(ctx, bad, "", stores, stateDir); code != 400 || err == nil {
		t.Fatalf("two layers on one disk = %d, %v", code, err)
	}
	garbled := app
	garbled.RootHash = "../../etc"
	bad = IncomingRequest{ID: "pod1", Disks: disks[1:], Layers: []Layer{garbled}}
	if _, _, code, err := incomingDisks(ctx, bad, "", stores, stateDir); code != 409 || err == nil || !strings.Contains(err.Error(), "not 64 lower-case hex") {
		t.Fatalf("a garbled root = %d, %v", code, err)
	}
	// A layer disk that the request does not describe is a plain disk:
	// without shared storage it is refused as before.
	if _, _, code, err := incomingDisks(ctx, IncomingRequest{ID: "pod1", Disks: disks}, "", stores, stateDir); code != 403 || err == nil {
		t.Fatalf("undescribed layer disks = %d, %v", code, err)
	}
}
