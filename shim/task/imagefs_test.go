package task

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/launcher/layercache"
)

// countingHost is the fake host with the shim's LayerAccountant, as
// hostVMs has it.
type countingHost struct {
	fakeHost
	acct *recordingAccountant
}

func (h countingHost) LayerAccountant(cacheDir string) layercache.Accountant {
	h.acct.mu.Lock()
	defer h.acct.mu.Unlock()
	h.acct.dirs = append(h.acct.dirs, cacheDir)
	return h.acct
}

// recordingAccountant records the layers the cache counts.
type recordingAccountant struct {
	mu    sync.Mutex
	dirs  []string
	added []digest.Digest
}

func (a *recordingAccountant) Add(ctx context.Context, e layercache.Entry) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.added = append(a.added, e.DiffID)
	return nil
}

func (a *recordingAccountant) Remove(context.Context, digest.Digest) error { return nil }

func (a *recordingAccountant) Counted(context.Context) ([]digest.Digest, error) { return nil, nil }

// The layers a pod's shim builds are counted in the node's image file
// system (CRI ImageFsInfo) as soon as they are built, once each; a layer
// the cache already holds is not counted again.
func TestLayerModeCountsTheLayersItBuilds(t *testing.T) {
	h := newHarness(t, setup{})
	acct := &recordingAccountant{}
	h.s.host = countingHost{fakeHost{h.host}, acct}
	ctrd := h.host.Containerd()
	app := ctrd.Image("app", "base", "app")
	tool := ctrd.Image("tool", "base", "tool")
	ctrd.Run("pod1", app)
	ctrd.Run("c1", tool)
	h.create("pod1", "pod1")
	h.create("c1", "pod1")
	acct.mu.Lock()
	defer acct.mu.Unlock()
	want := []digest.Digest{app.Layers[0].DiffID, app.Layers[1].DiffID, tool.Layers[1].DiffID}
	slices.Sort(want)
	got := slices.Clone(acct.added)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("counted %v, want each built layer once: %v", got, want)
	}
	if len(acct.dirs) != 1 || acct.dirs[0] != h.cache().Dir() {
		t.Fatalf("accountant asked for caches %v, want the pod's %s once", acct.dirs, h.cache().Dir())
	}
}
