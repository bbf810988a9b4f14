package e2e

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criPod is a pod sandbox run through containerd's CRI by a test.
type criPod struct {
	e   *env
	rt  cri.RuntimeServiceClient
	ctx context.Context
	cfg *cri.PodSandboxConfig
	id  string
}

// runCRIPod connects to e's CRI and runs a pod with cfg and handler c8s.
// The pod is stopped and removed at cleanup unless remove did it.
func runCRIPod(ctx context.Context, t *testing.T, e *env, cfg *cri.PodSandboxConfig) *criPod {
	t.Helper()
	p := &criPod{e: e, ctx: ctx, cfg: cfg}
	p.connect(t)
	resp, err := p.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: "c8s"})
	if err != nil {
		t.Fatalf("RunPodSandbox with handler c8s: %v\ncontainerd log:\n%s", err, e.d.Log())
	}
	p.id = resp.PodSandboxId
	t.Cleanup(func() {
		p.rt.StopPodSandbox(context.Background(), &cri.StopPodSandboxRequest{PodSandboxId: p.id})
		p.rt.RemovePodSandbox(context.Background(), &cri.RemovePodSandboxRequest{PodSandboxId: p.id})
	})
	return p
}

// connect dials e's CRI; the connection is closed at cleanup.
func (p *criPod) connect(t *testing.T) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+p.e.d.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.rt = cri.NewRuntimeServiceClient(conn)
}

// start creates and starts a container in the pod and returns its id.
func (p *criPod) start(t *testing.T, cfg *cri.ContainerConfig) string {
	t.Helper()
	ctr, err := p.rt.CreateContainer(p.ctx, &cri.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.cfg})
	if err != nil {
		t.Fatalf("CreateContainer: %v\ncontainerd log:\n%s", err, p.e.d.Log())
	}
	if _, err := p.rt.StartContainer(p.ctx, &cri.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v\ncontainerd log:\n%s", err, p.e.d.Log())
	}
	return ctr.ContainerId
}

// remove stops and removes the containers and the pod, and checks that
// nothing is left behind.
func (p *criPod) remove(t *testing.T, ctrs ...string) {
	t.Helper()
	for _, id := range ctrs {
		if _, err := p.rt.StopContainer(p.ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: 5}); err != nil {
			t.Fatalf("StopContainer: %v", err)
		}
		if _, err := p.rt.RemoveContainer(p.ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatalf("RemoveContainer: %v", err)
		}
	}
	if _, err := p.rt.StopPodSandbox(p.ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if _, err := p.rt.RemovePodSandbox(p.ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	p.e.assertNothingLeft(t)
}

// hostNetworkPod is the config of a host-network pod (no CNI) named name.
// Like the kubelet's, it has no hostname: the pod takes the node's, and a
// hostname is refused, as with runc (crihost_test.go).
func hostNetworkPod(name string) *cri.PodSandboxConfig {
	return &cri.PodSandboxConfig{
		Metadata: &cri.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name + "-1"},
		Linux: &cri.LinuxPodSandboxConfig{SecurityContext: &cri.LinuxSandboxSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE},
		}},
	}
}
