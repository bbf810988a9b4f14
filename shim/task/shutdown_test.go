package task

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/mount"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
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
	created := h.shutdownDuringCreate(g.entered)
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
	if n := len(h.host.Started()); n != 0 {
		t.Fatalf("%d pod VMs started under the shutdown", n)
	}
	if _, err := h.s.Create(h.ctx, h.request("c2", "")); err == nil {
		t.Fatal("a Create after the shutdown was taken")
	}
}

// slowAgent holds CreateContainer until its call is cancelled.
type slowAgent struct {
	agent.AgentService
	entered chan struct{}
}

func (a slowAgent) CreateContainer(ctx context.Context, req *agent.CreateContainerRequest) (*agent.CreateContainerResponse, error) {
	close(a.entered)
	<-ctx.Done()
	return nil, ctx.Err()
}

// slowGuest is a started pod VM whose agent is a slowAgent.
type slowGuest struct {
	Sandbox
	agent slowAgent
}

func (g slowGuest) Agent() agent.AgentService { return g.agent }

type slowGuestHost struct {
	fakeHost
	entered chan struct{}
}

func (h slowGuestHost) StartSandbox(ctx context.Context, opts sandbox.Options) (Sandbox, error) {
	sb, err := h.fakeHost.StartSandbox(ctx, opts)
	if err != nil {
		return nil, err
	}
	return slowGuest{Sandbox: sb, agent: slowAgent{AgentService: sb.Agent(), entered: h.entered}}, nil
}

// TestShutdownDuringCreateAfterBoot: the pod VM runs and the guest is
// creating the container when the shutdown comes. The Create is cancelled
// and stops the VM and removes the root disk it built before the shim
// exits.
// containerd's Shutdown has a deadline (3 s) shorter than a booted VM's
// stop may take: past it, the shim still waits for the Create's cleanup.
func TestShutdownDuringCreateAfterBoot(t *testing.T) {
	h := newHarness(t, setup{})
	g := slowGuestHost{fakeHost: fakeHost{h.host}, entered: make(chan struct{})}
	h.s.host = g
	expired, cancel := context.WithTimeout(h.ctx, time.Nanosecond)
	defer cancel()
	created := h.shutdownDuringCreateWithin(expired, g.entered)
	// Shutdown returned: the Create has undone its work already.
	select {
	case err := <-created:
		if err == nil {
			t.Fatal("Create succeeded under the shutdown")
		}
	default:
		t.Fatal("Shutdown returned (and the shim exits) before the cancelled Create cleaned up")
	}
	select {
	case <-h.sd.Done():
	case <-time.After(wait):
		t.Fatal("the shim did not shut down")
	}
	started := h.host.Started()
	if len(started) != 1 || !started[0].Stopped() {
		t.Fatalf("pod VMs %d, the first stopped: %v", len(started), len(started) == 1 && started[0].Stopped())
	}
	built, removed := h.host.Images()
	if len(built) != 1 || !slices.Equal(built, removed) {
		t.Fatalf("root disks built %v, removed %v", built, removed)
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

// shutdownDuringCreate creates container c1 in the background, shuts the
// shim down once the Create has reached entered, and returns the Create's
// result to come.
func (h *harness) shutdownDuringCreate(entered <-chan struct{}) <-chan error {
	return h.shutdownDuringCreateWithin(h.ctx, entered)
}

// shutdownDuringCreateWithin is shutdownDuringCreate with the Shutdown's
// context ctx (containerd's, with its deadline).
func (h *harness) shutdownDuringCreateWithin(ctx context.Context, entered <-chan struct{}) <-chan error {
	h.t.Helper()
	created := make(chan error, 1)
	go func() {
		_, err := h.s.Create(h.ctx, h.request("c1", ""))
		created <- err
	}()
	select {
	case <-entered:
	case <-time.After(wait):
		h.t.Fatal("Create never reached the point of the shutdown")
	}
	if _, err := h.s.Shutdown(ctx, &taskAPI.ShutdownRequest{ID: "c1"}); err != nil {
		h.t.Fatal(err)
	}
	return created
}
