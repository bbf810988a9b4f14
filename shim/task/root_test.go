package task

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/ctrdimage"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/shim/layers"
	"github.com/c8s-dev/c8s/shim/task/internal/fakesandbox"
)

// tdx is a harness setup whose pods refuse a host-copied root.
var tdx = setup{hypervisor: "tee = \"tdx\"\nfirmware = \"/proc/self/exe\""}

// cache opens the harness node's layer cache (runtime.state_dir's
// cache/layers: the config names no other).
func (h *harness) cache() *layercache.Cache {
	h.t.Helper()
	c, err := layercache.Open(filepath.Join(h.stateDir, "cache", "layers"))
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// refs returns the live references per cached layer.
func (h *harness) refs() map[digest.Digest]int {
	h.t.Helper()
	ls, err := h.cache().List()
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[digest.Digest]int{}
	for _, l := range ls {
		if n := l.LiveRefs(); n > 0 {
			out[l.DiffID] = n
		}
	}
	return out
}

// createReq returns the CreateContainer request the guest got for id.
func createReq(t *testing.T, calls []fakesandbox.Call, id string) *agent.CreateContainerRequest {
	t.Helper()
	for _, c := range calls {
		if r := c.Req.(*agent.CreateContainerRequest); r.ContainerId == id {
			return r
		}
	}
	t.Fatalf("no CreateContainer of %s", id)
	return nil
}

func layerIDs(im ctrdimage.Image) []string {
	var out []string
	for _, l := range im.Layers {
		out = append(out, layers.DiskID(l.DiffID))
	}
	return out
}

func diskIDs[V any](m map[string]V) []string {
	var out []string
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Layer mode: the pod VM boots with its first container's layers, later
// containers hot-plug only the layers the VM lacks, and each layer goes
// with the last container using it. Nothing is copied per container.
func TestLayerModeAttachesEachLayerOncePerPod(t *testing.T) {
	h := newHarness(t, setup{})
	ctrd := h.host.Containerd()
	app := ctrd.Image("app", "base", "app")
	tool := ctrd.Image("tool", "base", "tool")
	for id, im := range map[string]ctrdimage.Image{"pod1": app, "c1": app, "c2": tool} {
		ctrd.Run(id, im)
	}
	h.create("pod1", "pod1")
	sb := h.vm()
	boot := sb.Options().Disks
	if len(boot) != 2 || boot[0].ID != layerIDs(app)[0] || boot[1].ID != layerIDs(app)[1] || !boot[0].ReadOnly || !boot[1].ReadOnly {
		t.Fatalf("VM booted with %+v, want app's two layers read-only", boot)
	}
	h.create("c1", "pod1")
	h.create("c2", "pod1")
	if built, _ := h.host.Images(); len(built) != 0 {
		t.Fatalf("root disks copied in layer mode: %v", built)
	}
	if want := sorted(append(layerIDs(app), layerIDs(tool)[1])); !slices.Equal(diskIDs(sb.Disks()), want) {
		t.Fatalf("disks %v, want each layer once: %v", diskIDs(sb.Disks()), want)
	}
	if n := h.host.Conversions(); n != 3 {
		t.Fatalf("%d layer conversions, want 3", n)
	}
	calls := sb.Calls("CreateContainer")
	for id, im := range map[string]ctrdimage.Image{"pod1": app, "c1": app, "c2": tool} {
		r := createReq(t, calls, id).Rootfs
		if r.GetSource() != nil || r.GetFstype() != "ext4" || len(r.Layers) != len(im.Layers) {
			t.Fatalf("%s: Rootfs %v, want %d layers and no disk", id, r, len(im.Layers))
		}
		for i, l := range r.Layers {
			addr := sb.Disks()[layers.DiskID(im.Layers[i].DiffID)]
			if l.Digest != im.Layers[i].DiffID.String() || l.RootHash != im.Layers[i].DiffID.Encoded() || l.DataBlocks != 1 ||
				l.Scsi.GetLun() != uint32(addr.LUN) || l.Scsi.GetTarget() != uint32(addr.Target) {
				t.Errorf("%s layer %d: %v, want %s at %+v", id, i, l, im.Layers[i].DiffID, addr)
			}
		}
	}
	if r := h.refs(); len(r) != 3 || r[app.Layers[0].DiffID] != 1 {
		t.Fatalf("cache references %v, want the pod once on each of 3 layers", r)
	}
	if st, _ := ReadBundleState(createReqBundle(h, "c1")); st.Disk != "" {
		t.Errorf("bundle state of a layered container names a disk: %+v", st)
	}

	// c2 goes: only tool's own layer leaves the VM and the cache's refs.
	h.delete("c2")
	if want := sorted(layerIDs(app)); !slices.Equal(diskIDs(sb.Disks()), want) {
		t.Fatalf("after c2: disks %v, want %v", diskIDs(sb.Disks()), want)
	}
	if r := h.refs(); len(r) != 2 || r[tool.Layers[1].DiffID] != 0 {
		t.Fatalf("after c2: references %v", r)
	}
	h.delete("c1")
	if len(sb.Disks()) != 2 {
		t.Fatalf("after c1: disks %v: pod1 still uses app's layers", diskIDs(sb.Disks()))
	}
	h.delete("pod1")
	if !sb.Stopped() || len(h.refs()) != 0 {
		t.Fatalf("after the last container: VM stopped %v, references %v", sb.Stopped(), h.refs())
	}
	// The layers stay cached for the next pod (shim/layers tests that it
	// converts nothing).
	if s, _ := layercache.Usage(h.cache().Dir()); s.Layers != 3 {
		t.Fatalf("cache after the pod: %+v", s)
	}
	if !ctrd.Balanced() {
		t.Error("a connection to containerd's images was left open")
	}
}

// snp and tdx pods run images without runtime.allow_host_rootfs; a
// container without an image there is refused, saying why and what to do.
func TestLayerModeConfidential(t *testing.T) {
	h := newHarness(t, tdx)
	ctrd := h.host.Containerd()
	app := ctrd.Image("app", "base", "app")
	ctrd.Run("pod1", app)
	h.create("pod1", "pod1")
	_, err := h.s.Create(h.ctx, h.request("c1", "pod1"))
	if !isClass(err, errdefs.ErrFailedPrecondition) || !errors.Is(err, layers.ErrUnavailable) ||
		!strings.Contains(err.Error(), "has no image") || !strings.Contains(err.Error(), "allow_host_rootfs") {
		t.Fatalf("a tdx container without an image: %s, want a refusal naming both", errClass(err))
	}
	// A layer discarded from the content store and not cached.
	tool := ctrd.Image("tool", "base", "tool")
	ctrd.DropBlob(tool.Layers[1].Blob.Digest)
	ctrd.Run("c2", tool)
	_, err = h.s.Create(h.ctx, h.request("c2", "pod1"))
	if !isClass(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "discard_unpacked_layers") || !strings.Contains(err.Error(), tool.Layers[1].DiffID.String()) {
		t.Fatalf("a discarded layer: %s", errClass(err))
	}
	if built, _ := h.host.Images(); len(built) != 0 {
		t.Fatalf("a tdx pod copied a root: %v", built)
	}
	if r := h.refs(); len(r) != 2 {
		t.Fatalf("references after refusals: %v, want pod1's two", r)
	}
}

// Where the host may copy the root, a container without an image gets the
// copy; runtime.rootfs = "copy" copies even an image's.
func TestLayerModeFallsBackToCopy(t *testing.T) {
	h := newHarness(t, setup{})
	h.create("pod1", "pod1")
	if built, _ := h.host.Images(); len(built) != 1 {
		t.Fatalf("root disks built for a container without an image: %v", built)
	}
	if r := createReq(t, h.vm().Calls("CreateContainer"), "pod1").Rootfs; r.GetScsi() == nil || len(r.Layers) != 0 {
		t.Fatalf("Rootfs of a copy: %v", r)
	}

	c := newHarness(t, setup{tables: "rootfs = \"copy\"\n"})
	ctrd := c.host.Containerd()
	ctrd.Run("pod1", ctrd.Image("app", "base"))
	c.create("pod1", "pod1")
	if built, _ := c.host.Images(); len(built) != 1 || c.host.Conversions() != 0 {
		t.Fatalf("runtime.rootfs = copy: built %v, %d conversions", built, c.host.Conversions())
	}
}

// A container that fails after its layers were attached leaves the VM and
// the cache as they were: its own layers detached and released, the
// layers others use kept.
func TestLayerModeFailedCreateReleases(t *testing.T) {
	h := newHarness(t, setup{})
	ctrd := h.host.Containerd()
	app := ctrd.Image("app", "base", "app")
	tool := ctrd.Image("tool", "base", "tool")
	ctrd.Run("pod1", app)
	ctrd.Run("c1", tool)
	h.create("pod1", "pod1")
	sb := h.vm()
	sb.Fail("CreateContainer", errors.New("refused by the policy"))
	if _, err := h.s.Create(h.ctx, h.request("c1", "pod1")); err == nil {
		t.Fatal("Create succeeded")
	}
	if want := sorted(layerIDs(app)); !slices.Equal(diskIDs(sb.Disks()), want) {
		t.Fatalf("after the failed Create: disks %v, want %v", diskIDs(sb.Disks()), want)
	}
	if r := h.refs(); len(r) != 2 || r[tool.Layers[1].DiffID] != 0 {
		t.Fatalf("after the failed Create: references %v", r)
	}

	// The first container failing stops the VM and releases everything.
	f := newHarness(t, setup{})
	f.host.Containerd().Run("pod1", f.host.Containerd().Image("app", "base"))
	f.host.Next().Fail("CreateContainer", errors.New("refused"))
	if _, err := f.s.Create(f.ctx, f.request("pod1", "pod1")); err == nil {
		t.Fatal("Create succeeded")
	}
	if !f.vm().Stopped() || len(f.refs()) != 0 {
		t.Fatalf("after the first container failed: VM stopped %v, references %v", f.vm().Stopped(), f.refs())
	}
	// A conversion that fails fails the container before the VM starts.
	g := newHarness(t, setup{})
	g.host.Containerd().Run("pod1", g.host.Containerd().Image("app", "base"))
	g.host.Fail("ConvertLayer", errors.New("gzip: invalid header"))
	if _, err := g.s.Create(g.ctx, g.request("pod1", "pod1")); err == nil || !strings.Contains(err.Error(), "gzip: invalid header") {
		t.Fatalf("Create with a failing conversion: %v", err)
	}
	if len(g.host.Started()) != 0 || len(g.refs()) != 0 {
		t.Fatalf("after a failed conversion: %d VMs, references %v", len(g.host.Started()), g.refs())
	}
}

func sorted(s []string) []string { slices.Sort(s); return s }

// delete removes a created container and fails the test on error.
func (h *harness) delete(id string) {
	h.t.Helper()
	if _, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: id}); err != nil {
		h.t.Fatalf("Delete %s: %v", id, err)
	}
}

func createReqBundle(h *harness, id string) string {
	c, err := h.s.get(id)
	if err != nil {
		h.t.Fatal(err)
	}
	return c.bundle
}
