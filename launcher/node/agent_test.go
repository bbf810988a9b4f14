package node

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/c8s-dev/c8s/launcher/node/deviceplugin"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
)

// fakeNode is a Node object as JSON, patched the way the API server
// applies JSON merge patches (RFC 7386).
type fakeNode struct {
	obj     map[string]any
	patches int
	// units is what the scheduler counts for the node's pods (PodCounter).
	units map[string]int64
}

func (f *fakeNode) PodUnits(context.Context) (map[string]int64, error) { return f.units, nil }

func (f *fakeNode) Node(context.Context) (labels.Node, map[string]string, error) {
	str := func(path ...string) map[string]string {
		out := map[string]string{}
		var v any = f.obj
		for _, k := range path {
			m, _ := v.(map[string]any)
			v = m[k]
		}
		m, _ := v.(map[string]any)
		for k, x := range m {
			out[k], _ = x.(string)
		}
		return out
	}
	n := labels.Node{Labels: str("metadata", "labels"), Annotations: str("metadata", "annotations")}
	spec, _ := f.obj["spec"].(map[string]any)
	if ts, ok := spec["taints"]; ok {
		b, _ := json.Marshal(ts)
		if err := json.Unmarshal(b, &n.Taints); err != nil {
			return n, nil, err
		}
	}
	return n, str("status", "capacity"), nil
}

func (f *fakeNode) Patch(_ context.Context, patch []byte) error       { return f.apply(patch) }
func (f *fakeNode) PatchStatus(_ context.Context, patch []byte) error { return f.apply(patch) }

func (f *fakeNode) apply(patch []byte) error {
	var p map[string]any
	if err := json.Unmarshal(patch, &p); err != nil {
		return err
	}
	f.obj = mergePatch(f.obj, p).(map[string]any)
	f.patches++
	return nil
}

func mergePatch(target any, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	tm, ok := target.(map[string]any)
	if !ok {
		tm = map[string]any{}
	}
	for k, v := range pm {
		if v == nil {
			delete(tm, k)
		} else {
			tm[k] = mergePatch(tm[k], v)
		}
	}
	return tm
}

// kubelet is a fake kubelet: device plugin registration and PodResources.
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	podresources.UnimplementedPodResourcesListerServer
	registered chan string
	held       []*podresources.PodResources
}

func (k *kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.registered <- r.ResourceName
	return &pluginapi.Empty{}, nil
}

func (k *kubelet) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	return &podresources.ListPodResourcesResponse{PodResources: k.held}, nil
}

func serve(t *testing.T, path string, register func(*grpc.Server)) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
}

func TestAgentReconcilesTheNode(t *testing.T) {
	dir, err := os.MkdirTemp("", "c8s-na-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k := &kubelet{registered: make(chan string, 8), held: []*podresources.PodResources{{
		Namespace: "default", Name: "snp-pod", Containers: []*podresources.ContainerResources{{
			Name: "app", Devices: []*podresources.ContainerDevices{{ResourceName: labels.ResourceSNPASID, DeviceIds: []string{"snp-asid-0"}}},
		}},
	}}}
	serve(t, filepath.Join(dir, "kubelet.sock"), func(s *grpc.Server) { pluginapi.RegisterRegistrationServer(s, k) })
	podRes := filepath.Join(dir, "pod-resources.sock")
	serve(t, podRes, func(s *grpc.Server) { podresources.RegisterPodResourcesListerServer(s, k) })

	fixture := "snp-host"
	node := &fakeNode{obj: map[string]any{"metadata": map[string]any{"labels": map[string]any{"kubernetes.io/hostname": "n1"}}},
		units: map[string]int64{labels.ResourceSNPASID: 1}}
	plugins := deviceplugin.NewManager(context.Background(), dir)
	t.Cleanup(func() { _ = plugins.Stop() })
	taint := &labels.Taint{Key: "c8s.io/confidential", Value: "true", Effect: "NoSchedule"}
	a := &Agent{
		Client: node,
		Discover: func() (discovery.Result, error) {
			return discovery.Discover(discovery.Options{Root: filepath.Join("discovery", "testdata", fixture), SimSlots: 2})
		},
		Settings:           labels.Settings{Taint: taint},
		Plugins:            plugins,
		PodResourcesSocket: podRes,
	}
	ctx := context.Background()
	rep, err := a.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, capacity, _ := node.Node(ctx)
	want := map[string]string{"kubernetes.io/hostname": "n1", labels.LabelSNP: "true", labels.LabelSim: "true",
		labels.NFDSNP: "true", labels.LabelTrustShape: "pod-as-cvm", labels.LabelTrustPool: "snp"}
	if !reflect.DeepEqual(n.Labels, want) || !reflect.DeepEqual(n.Taints, []labels.Taint{*taint}) {
		t.Fatalf("node after the first pass: labels %v taints %v", n.Labels, n.Taints)
	}
	if n.Annotations[labels.OwnedLabelsAnnotation] != labels.NFDSNP || len(capacity) != 0 || rep.StatusPatched != nil {
		t.Fatalf("annotations %v capacity %v status patch %s", n.Annotations, capacity, rep.StatusPatched)
	}
	// misc.current says 3 SEV-ES/SNP ASIDs are in use and the scheduler
	// counts one pod's: two are used outside Kubernetes.
	if u := rep.Usage[labels.ResourceSNPASID]; u != (deviceplugin.Usage{Devices: 99, HostUsed: 3, Counted: 1, Held: 1, Reserved: 2}) {
		t.Fatalf("SNP ASID usage = %+v", u)
	}
	got := map[string]bool{}
	for range 2 {
		select {
		case r := <-k.registered:
			got[r] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("device plugins registered: %v", got)
		}
	}
	if !got[labels.ResourceSNPASID] || !got[labels.ResourceSimSlot] {
		t.Fatalf("registered %v", got)
	}

	// Nothing changed: nothing is patched.
	if rep, err := a.Once(ctx); err != nil || rep.Patched != nil || rep.StatusPatched != nil {
		t.Fatalf("second pass: %s %s %v", rep.Patched, rep.StatusPatched, err)
	}

	// The node turns into an SGX host without SNP: the SNP labels, the
	// plugin go; the EPC appears in the status capacity.
	fixture = "sgx-host"
	if _, err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	n, capacity, _ = node.Node(ctx)
	if _, ok := n.Labels[labels.LabelSNP]; ok || n.Labels[labels.NFDSGX] != "true" || n.Labels[labels.LabelTrustPool] != "sim" {
		t.Fatalf("labels on the SGX host: %v", n.Labels)
	}
	if _, ok := n.Labels[labels.NFDSNP]; ok {
		t.Fatalf("the NFD SNP label c8s set is still there: %v", n.Labels)
	}
	if capacity[labels.ResourceSGXEPC] != "68451041280" {
		t.Fatalf("status capacity = %v", capacity)
	}
	if plugins.Plugin(labels.ResourceSNPASID) != nil || plugins.Plugin(labels.ResourceSimSlot) == nil {
		t.Fatal("the plugins do not follow the resources")
	}

	// And back: the EPC capacity is removed again.
	fixture = "plain-host"
	if _, err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if _, capacity, _ = node.Node(ctx); len(capacity) != 0 {
		t.Fatalf("status capacity on the plain host = %v", capacity)
	}
}

func TestStatusPatch(t *testing.T) {
	epc := []labels.Resource{{Name: labels.ResourceSGXEPC, Count: 1024}, {Name: labels.ResourceSimSlot, Count: 2, DevicePlugin: true}}
	b, err := statusPatch(nil, epc)
	if err != nil || string(b) != `{"status":{"allocatable":{"sgx.intel.com/epc":"1024"},"capacity":{"sgx.intel.com/epc":"1024"}}}` {
		t.Fatalf("%s %v", b, err)
	}
	if b, _ := statusPatch(map[string]string{labels.ResourceSGXEPC: "1024", "cpu": "2"}, epc); b != nil {
		t.Fatalf("unchanged capacity patched: %s", b)
	}
	b, _ = statusPatch(map[string]string{labels.ResourceSGXEPC: "1024", "example.com/other": "1"}, nil)
	if string(b) != `{"status":{"allocatable":{"sgx.intel.com/epc":null},"capacity":{"sgx.intel.com/epc":null}}}` {
		t.Fatalf("removal: %s", b)
	}
}
