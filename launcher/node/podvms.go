package node

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/node/deviceplugin"
	"github.com/c8s-dev/c8s/launcher/node/reattest"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

// The node's side of re-attestation: its running pod VMs (the state
// dir), their shims (the Admin API) and the container runtime (CRI).

// CRINamespace is the containerd namespace of Kubernetes' pods.
const CRINamespace = "k8s.io"

// StateSandboxes are the pod VMs running under a state root
// (runtime.state_dir) in one containerd namespace: each VM state dir whose
// QEMU is alive (deviceplugin.ScanVMs). VMs migrating in are not pods of
// this node yet.
type StateSandboxes struct {
	StateRoot, ProcRoot string
	// Namespace is the containerd namespace (default CRINamespace).
	Namespace string
}

var _ reattest.Sandboxes = StateSandboxes{}

// Sandboxes implements reattest.Sandboxes.
func (s StateSandboxes) Sandboxes(context.Context) ([]reattest.Sandbox, error) {
	ns := s.Namespace
	if ns == "" {
		ns = CRINamespace
	}
	proc := s.ProcRoot
	if proc == "" {
		proc = "/proc"
	}
	vms, err := deviceplugin.ScanVMs(s.StateRoot, proc)
	if err != nil {
		return nil, err
	}
	var out []reattest.Sandbox
	for _, vm := range vms {
		if !vm.Alive || vm.ID == "" || vm.Namespace != ns {
			continue
		}
		if filepath.Clean(vm.StateDir) != filepath.Clean(statedir.ForPod(s.StateRoot, ns, vm.ID).VM) {
			continue // not a pod's own state dir (an incoming migration)
		}
		out = append(out, reattest.Sandbox{Namespace: ns, ID: vm.ID})
	}
	return out, nil
}

// ShimEvidence asks a pod's shim for evidence through its Admin API, on
// the ttrpc socket containerd's shim manager derives from containerd's
// address, the namespace and the sandbox id.
type ShimEvidence struct {
	// ContainerdAddress is containerd's socket.
	ContainerdAddress string
}

var _ reattest.Shims = ShimEvidence{}

// Evidence implements reattest.Shims.
func (s ShimEvidence) Evidence(ctx context.Context, sb reattest.Sandbox, nonce []byte) (*adminapi.EvidenceResponse, error) {
	ctx = namespaces.WithNamespace(ctx, sb.Namespace)
	addr, err := shim.SocketAddress(ctx, s.ContainerdAddress, sb.ID, false)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", strings.TrimPrefix(addr, "unix://"))
	if err != nil {
		return nil, fmt.Errorf("the shim of sandbox %s: %w", sb.ID, err)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	resp, err := adminapi.NewAdminClient(client).Evidence(ctx, &adminapi.EvidenceRequest{Nonce: nonce})
	if err != nil {
		return nil, fmt.Errorf("the shim of sandbox %s: %w", sb.ID, err)
	}
	if resp.Sandbox != sb.ID {
		return nil, fmt.Errorf("the shim socket of sandbox %s answered for sandbox %q", sb.ID, resp.Sandbox)
	}
	return resp, nil
}

// CRI is the container runtime through the CRI, the interface the kubelet
// itself uses: which pod a sandbox runs (PodSandboxStatus) and stopping
// it (StopPodSandbox: the runtime stops the containers, the pod VM and
// the sandbox's network as it does for the kubelet, which then sees the
// sandbox gone and applies the pod's restart policy).
type CRI struct {
	conn   *grpc.ClientConn
	client runtimeapi.RuntimeServiceClient
}

var _ reattest.Runtime = (*CRI)(nil)

// NewCRI returns a CRI client of the runtime at endpoint (a unix socket
// path, with or without unix://); it connects on first use.
func NewCRI(endpoint string) (*CRI, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Clean(strings.TrimPrefix(endpoint, "unix://")), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI %s: %w", endpoint, err)
	}
	return &CRI{conn: conn, client: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *CRI) Close() error { return c.conn.Close() }

// Pod implements reattest.Runtime.
func (c *CRI) Pod(ctx context.Context, sb reattest.Sandbox) (reattest.Pod, error) {
	resp, err := c.client.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.ID})
	if err != nil {
		return reattest.Pod{}, fmt.Errorf("CRI PodSandboxStatus %s: %w", sb.ID, err)
	}
	md := resp.GetStatus().GetMetadata()
	if md.GetName() == "" {
		return reattest.Pod{}, fmt.Errorf("CRI PodSandboxStatus %s: no pod metadata", sb.ID)
	}
	return reattest.Pod{Namespace: md.GetNamespace(), Name: md.GetName(), UID: md.GetUid()}, nil
}

// StopSandbox implements reattest.Runtime.
func (c *CRI) StopSandbox(ctx context.Context, sb reattest.Sandbox) error {
	if _, err := c.client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.ID}); err != nil {
		return fmt.Errorf("CRI StopPodSandbox %s: %w", sb.ID, err)
	}
	return nil
}
