package task

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/grpc"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/c8s-dev/c8s/internal/golden"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/labels"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
	"github.com/c8s-dev/c8s/shim/sandbox"
)

// kubeletPodResources serves the PodResources API as a kubelet would
// with pods: namespace/name to container to GPU addresses.
type kubeletPodResources struct {
	podresources.UnimplementedPodResourcesListerServer
	pods map[[2]string]map[string][]string
}

func (k *kubeletPodResources) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	resp := &podresources.ListPodResourcesResponse{}
	for p, conts := range k.pods {
		pr := &podresources.PodResources{Namespace: p[0], Name: p[1]}
		for name, ids := range conts {
			pr.Containers = append(pr.Containers, &podresources.ContainerResources{Name: name, Devices: []*podresources.ContainerDevices{
				{ResourceName: labels.ResourceConfidentialGPU, DeviceIds: ids},
				{ResourceName: labels.ResourceSimSlot, DeviceIds: []string{"sim-slot-0"}},
			}})
		}
		resp.PodResources = append(resp.PodResources, pr)
	}
	return resp, nil
}

// serveKubelet starts a fake kubelet PodResources socket.
func serveKubelet(t *testing.T, pods map[[2]string]map[string][]string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "c8s-pr") // short: a unix socket
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "kubelet.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresources.RegisterPodResourcesListerServer(srv, &kubeletPodResources{pods: pods})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return socket
}

// withGPUHost points the shim's GPU checks at the gpu-host fixture: two
// usable GPUs (0000:41:00.0 on iommufd, 0000:c1:00.0 on a VFIO group)
// and 0000:81:00.0 with CC mode off.
func withGPUHost(t *testing.T) {
	old := gpuSysRoot
	gpuSysRoot = filepath.Join("..", "..", "launcher", "node", "discovery", "testdata", "gpu-host")
	t.Cleanup(func() { gpuSysRoot = old })
}

// TestGPUAllocationToQEMUArgs follows a pod's GPUs from the kubelet's
// allocation to the QEMU command line: the sandbox container of a
// Kubernetes pod whose app containers hold two nvidia.com/confidential-gpu
// devices starts its VM with both cold-plugged (sandbox.Options.VFIO),
// and the VM that options make has the golden argv for snp and tdx.
func TestGPUAllocationToQEMUArgs(t *testing.T) {
	withGPUHost(t)
	socket := serveKubelet(t, map[[2]string]map[string][]string{
		{"ml", "trainer"}: {"app": {"0000:c1:00.0"}, "side": {"0000:41:00.0"}},
		{"ml", "other"}:   {"app": {"0000:81:00.0"}},
	})
	h := newHarness(t, setup{tables: "[devices]\npod_resources_socket = \"" + socket + "\"\n"})
	ann := map[string]string{
		SandboxIDAnnotation:        "sb-trainer",
		ContainerTypeAnnotation:    "sandbox",
		sandboxNameAnnotation:      "trainer",
		sandboxNamespaceAnnotation: "ml",
	}
	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: h.config})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.s.Create(h.ctx, &taskAPI.CreateTaskRequest{ID: "sb-trainer", Bundle: h.bundle("sb-trainer", ann), Options: opts}); err != nil {
		t.Fatal(err)
	}
	started := h.host.Started()
	if len(started) != 1 {
		t.Fatalf("%d VMs started", len(started))
	}
	got := started[0].Options()
	want := []vm.VFIODevice{{Host: "0000:41:00.0", IOMMUFD: true, Mem64Bytes: 128<<30 + 32<<20}, {Host: "0000:c1:00.0", Mem64Bytes: 128<<30 + 32<<20}}
	if !reflect.DeepEqual(got.VFIO, want) {
		t.Fatalf("the VM got VFIO devices %+v, want %+v", got.VFIO, want)
	}

	for _, teeName := range []string{"snp", "tdx"} {
		t.Run(teeName, func(t *testing.T) {
			// The node's packaged-style configuration, fixed paths.
			o := got
			o.ID, o.StateDir, o.Disks = "sb-trainer", "/run/c8s/sb-trainer", nil
			o.Config = config.Default()
			hv := &o.Config.Hypervisor
			hv.TEE, hv.Kernel, hv.Initrd, hv.Firmware = teeName, "/usr/share/c8s/vmlinuz", "/usr/share/c8s/initrd.img", "/usr/share/ovmf/OVMF.fd"
			hv.DefaultMemoryMiB = 16384
			b, err := tee.Lookup(teeName)
			if err != nil {
				t.Fatal(err)
			}
			argv, err := vm.Args(sandbox.VMSpec(o, nil, "kvm", "k8s.io"), b)
			if err != nil {
				t.Fatal(err)
			}
			golden.Check(t, "gpu-pod-"+teeName, []byte(strings.Join(argv, "\n")+"\n"))
		})
	}
}

func TestPodGPUs(t *testing.T) {
	withGPUHost(t)
	socket := serveKubelet(t, map[[2]string]map[string][]string{
		{"ml", "off"}:     {"app": {"0000:81:00.0"}},
		{"ml", "ghost"}:   {"app": {"0000:99:00.0"}},
		{"ml", "bogus"}:   {"app": {"gpu-0"}},
		{"ml", "nogpu"}:   {},
		{"ml", "trainer"}: {"app": {"0000:41:00.0"}},
	})
	ctx := context.Background()
	var cfg config.Config
	cfg.Devices.PodResourcesSocket = socket
	for _, c := range []struct {
		pod  k8sPod
		want string // error; "" for none
		n    int
	}{
		{k8sPod{"ml", "trainer"}, "", 1},
		{k8sPod{"ml", "off"}, "cannot go to a confidential pod: its CC mode is off", 0},
		{k8sPod{"ml", "ghost"}, "not an NVIDIA GPU on this host", 0},
		{k8sPod{"ml", "bogus"}, "not a PCI address", 0},
		{k8sPod{"ml", "nogpu"}, "", 0},
		{k8sPod{"ml", "unknown"}, "", 0},
		{k8sPod{}, "", 0}, // not a Kubernetes pod
	} {
		devs, err := podGPUs(ctx, cfg, c.pod)
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) || len(devs) != c.n {
			t.Errorf("pod %v: devices %+v, error %v; want %d devices, error %q", c.pod, devs, err, c.n, c.want)
		}
	}
	// No kubelet: no devices. A socket nobody serves: an error.
	cfg.Devices.PodResourcesSocket = filepath.Join(t.TempDir(), "none.sock")
	if devs, err := podGPUs(ctx, cfg, k8sPod{"ml", "trainer"}); err != nil || devs != nil {
		t.Fatalf("without a kubelet: %v %v", devs, err)
	}
	dead := filepath.Join(t.TempDir(), "dead.sock")
	if err := os.WriteFile(dead, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Devices.PodResourcesSocket = dead
	if _, err := podGPUs(ctx, cfg, k8sPod{"ml", "trainer"}); err == nil || !strings.Contains(err.Error(), "which GPUs the kubelet allocated") {
		t.Fatalf("a dead kubelet socket: %v", err)
	}
}
