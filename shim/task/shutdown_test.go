package task

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/mount"

	"github.com/c8s-dev/c8s/shim/sandbox"
)

// gatedHost holds StartSandbox until its gate opens or the Create is
// cancelled, as a real boot honours its context.
type gatedHost struct {
	fakeHost
	entered, gate chan struct{}
}

func (h gatedHost) StartSandbox(ctx context.Context, opts sandbox.Options) (Sandbox, error) {
	close(h.entered)
	select {
	case <-h.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return h.fakeHost.StartSandbox(ctx, opts)
}

// TestShutdownDuringCreate: containerd gives up on a Create that is still
// booting the pod VM and shuts the shim down (Delete finds nothing, then
// Shutdown). The Create must fail and undo its work before the shim exits:
// before, the shim exited under it, and the Create went on to start a VM
// nobody would stop, leaving its state dir, taps and layer references.
func TestShutdownDuringCreate(t *testing.T) {
	h := newHarness(t, setup{})
	g := gatedHost{fakeHost: fakeHost{h.host}, entered: make(chan struct{}), gate: make(chan struct{})}
	h.s.host = g
	created := make(chan error, 1)
	go func() {
		_, err := h.s.Create(h.ctx, h.request("c1", ""))
		created <- err
	}()
	select {
	case <-g.entered:
	case <-time.After(wait):
		t.Fatal("Create never reached the VM's start")
	}
	if _, err := h.s.Shutdown(h.ctx, &taskAPI.ShutdownRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.sd.Done():
	case <-time.After(wait):
		t.Fatal("the shim did not shut down")
	}
	close(g.gate) // the boot would have gone on
	select {
	case err := <-created:
		if err == nil {
			t.Fatal("Create succeeded after the shim shut down")
		}
	case <-time.After(wait):
		t.Fatal("Create did not return")
	}
	for _, sb := range h.host.Started() {
		if !sb.Stopped() {
			t.Fatal("a pod VM started under the shutdown runs on")
		}
	}
	if _, err := h.s.Create(h.ctx, h.request("c2", "")); err == nil {
		t.Fatal("a Create after the shutdown was taken")
	}
}

// recordingHost notes, as it builds a copied root disk, what the bundle's
// state tells `shim delete`.
type recordingHost struct {
	fakeHost
	seen *BundleState
}

func (h recordingHost) BuildRootfs(ctx context.Context, mounts []mount.Mount, rootfs, image string) error {
	if err := h.fakeHost.BuildRootfs(ctx, mounts, rootfs, image); err != nil {
		return err
	}
	st, err := ReadBundleState(filepath.Dir(rootfs))
	if err == nil {
		*h.seen = st
	}
	return nil
}

// TestBundleStateBeforeTheRootDisk: a shim killed while it builds a
// container's root disk (mkfs of a large snapshot) leaves `shim delete`
// the bundle's state to undo it by: it must name the disk from the moment
// the disk exists, or the disk is left on the node and a retry of the
// container fails on it.
func TestBundleStateBeforeTheRootDisk(t *testing.T) {
	h := newHarness(t, setup{})
	var seen BundleState
	h.s.host = recordingHost{fakeHost: fakeHost{h.host}, seen: &seen}
	h.create("c1", "")
	built, _ := h.host.Images()
	if len(built) != 1 {
		t.Fatalf("root disks built: %v", built)
	}
	if seen.Disk != built[0] || seen.Sandbox != "c1" || seen.StateDir == "" {
		t.Fatalf("while the disk %s was built, the bundle's state was %+v", built[0], seen)
	}
}
