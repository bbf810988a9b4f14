package task

import (
	"context"
	"slices"
	"testing"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/shim/sandbox"
	"github.com/c8s-dev/c8s/shim/task/internal/fakesandbox"
)

// lostReplyHost starts fake VMs whose agent creates container lose the
// reply for container "c1": the guest made the container, the shim sees
// an error (containerd's deadline passed, the connection hiccuped).
type lostReplyHost struct{ fakeHost }

type lostReplyVM struct{ *fakesandbox.Sandbox }

type lostReplyAgent struct{ agent.AgentService }

func (h lostReplyHost) StartSandbox(ctx context.Context, opts sandbox.Options) (Sandbox, error) {
	sb, err := h.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	return lostReplyVM{sb}, nil
}

func (v lostReplyVM) Agent() agent.AgentService { return lostReplyAgent{v.Sandbox.Agent()} }

func (a lostReplyAgent) CreateContainer(ctx context.Context, r *agent.CreateContainerRequest) (*agent.CreateContainerResponse, error) {
	resp, err := a.AgentService.CreateContainer(ctx, r)
	if err == nil && r.ContainerId == "c1" {
		return nil, context.DeadlineExceeded
	}
	return resp, err
}

// TestLostCreateReplyRemovesGuestContainer: a Create whose CreateContainer
// reply is lost (the guest made the container) detaches its root and drops
// its layers: the guest's container goes too, not left on a detached disk.
func TestLostCreateReplyRemovesGuestContainer(t *testing.T) {
	h := newHarness(t, setup{})
	h.s.host = lostReplyHost{fakeHost{h.host}}
	ctrd := h.host.Containerd()
	ctrd.Run("pod1", ctrd.Image("app", "base", "app"))
	ctrd.Run("c1", ctrd.Image("tool", "base", "tool"))
	h.create("pod1", "pod1")
	if _, err := h.s.Create(h.ctx, h.request("c1", "pod1")); err == nil {
		t.Fatal("Create succeeded")
	}
	sb := h.vm()
	t.Logf("guest containers after the failed Create: %v", sb.Containers())
	t.Logf("RemoveContainer calls: %d; DetachDisk calls: %d", len(sb.Calls("RemoveContainer")), len(sb.Calls("DetachDisk")))
	if slices.Contains(sb.Containers(), "c1") {
		t.Errorf("container c1 is left in the guest (its layer disk detached under it, refs dropped)")
	}
}
