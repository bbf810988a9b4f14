package node

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/c8s-dev/c8s/launcher/node/deviceplugin"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
)

// TestAgentServesConfidentialGPUs: from the gpu-host fixture the agent
// labels the node, and serves nvidia.com/confidential-gpu with one device
// per usable GPU, named by its PCI address, which Allocate hands on.
func TestAgentServesConfidentialGPUs(t *testing.T) {
	dir, err := os.MkdirTemp("", "c8s-gpu-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cs := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	plugins := deviceplugin.NewManager(context.Background(), dir)
	t.Cleanup(func() { _ = plugins.Stop() })
	a := &Agent{
		Client: &KubeClient{Clientset: cs, NodeName: "n1"},
		Discover: func() (discovery.Result, error) {
			return discovery.Discover(discovery.Options{Root: filepath.Join("discovery", "testdata", "gpu-host"), SimSlots: 2})
		},
		Plugins: plugins,
	}
	ctx := context.Background()
	rep, err := a.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{labels.LabelGPUCCCapable: "true", labels.LabelGPUProduct: "NVIDIA-H100-SXM5-80GB", labels.LabelSim: "true"} {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, n.Labels[k], v, n.Labels)
		}
	}
	if _, ok := n.Labels[labels.LabelGPUCCModeState]; ok {
		t.Errorf("cc.mode.state set on a node whose GPUs' modes differ: %v", n.Labels)
	}
	if u := rep.Usage[labels.ResourceConfidentialGPU]; u.Devices != 2 || u.Reserved != 0 {
		t.Fatalf("GPU usage %+v", u)
	}
	if got := listAndWatch(t, dir, labels.ResourceConfidentialGPU); got != "++" {
		t.Fatalf("ListAndWatch %s, want ++", got)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "c8s-confidential-gpu.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := pluginapi.NewDevicePluginClient(conn).Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"0000:c1:00.0"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cr := resp.GetContainerResponses()[0]
	if !reflect.DeepEqual(cr.GetEnvs(), map[string]string{"C8S_CONFIDENTIAL_GPU": "0000:c1:00.0"}) ||
		!reflect.DeepEqual(cr.GetAnnotations(), map[string]string{labels.ResourceConfidentialGPU: "0000:c1:00.0"}) || len(cr.GetDevices()) != 0 {
		t.Fatalf("allocation %+v", cr)
	}
	// A GPU that is not usable (CC mode off) is not a device.
	if _, err := pluginapi.NewDevicePluginClient(conn).Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"0000:81:00.0"}},
	}}); err == nil {
		t.Fatal("the CC-mode-off GPU was allocated")
	}
}
