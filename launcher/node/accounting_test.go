package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/c8s-dev/c8s/launcher/node/deviceplugin"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/internal/fakevms"
	"github.com/c8s-dev/c8s/launcher/node/labels"
)

// simPod is a c8s-sim pod on node n1: the RuntimeClass overhead takes its
// sim slot.
func simPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app"}},
			Overhead: corev1.ResourceList{labels.ResourceSimSlot: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("384Mi")}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// listAndWatch returns the device health the plugin for resource reports
// to the kubelet now, as '+' (healthy) and '-' per device.
func listAndWatch(t *testing.T, dir, resource string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock := filepath.Join(dir, "c8s-"+resource[strings.LastIndex(resource, "/")+1:]+".sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("ListAndWatch on %s: %v", sock, err)
	}
	var b strings.Builder
	for _, d := range resp.GetDevices() {
		if d.GetHealth() == pluginapi.Healthy {
			b.WriteByte('+')
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// TestSlotsAccountedForTheVMsLife: a pod VM keeps its sim slot from start
// until its QEMU is gone, also after Kubernetes stops counting its pod;
// ListAndWatch offers only the free slots.
func TestSlotsAccountedForTheVMsLife(t *testing.T) {
	dir, err := os.MkdirTemp("", "c8s-na-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	state, proc := filepath.Join(dir, "run-c8s"), filepath.Join(dir, "proc")
	cs := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, simPod("a"), simPod("b"),
		func() *corev1.Pod { p := simPod("elsewhere"); p.Spec.NodeName = "n2"; return p }())
	plugins := deviceplugin.NewManager(context.Background(), dir)
	t.Cleanup(func() { _ = plugins.Stop() })
	a := &Agent{
		Client: &KubeClient{Clientset: cs, NodeName: "n1"},
		Discover: func() (discovery.Result, error) {
			return discovery.Discover(discovery.Options{Root: filepath.Join("discovery", "testdata", "plain-host"), SimSlots: 3})
		},
		Plugins:   plugins,
		StateRoot: state,
		ProcRoot:  proc,
	}
	ctx := context.Background()
	vmA, vmB := filepath.Join(state, "k8s.io", "sandbox-a"), filepath.Join(state, "k8s.io", "sandbox-b")
	fakevms.Start(t, vmA, proc, 4001, "sim")
	fakevms.Start(t, vmB, proc, 4002, "sim")

	step := func(name string, want deviceplugin.Usage, health string) {
		t.Helper()
		rep, err := a.Once(ctx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := rep.Usage[labels.ResourceSimSlot]; got != want {
			t.Fatalf("%s: usage %+v, want %+v (VMs %+v)", name, got, want, rep.VMs)
		}
		if got := listAndWatch(t, dir, labels.ResourceSimSlot); got != health {
			t.Fatalf("%s: ListAndWatch reports %s, want %s", name, got, health)
		}
	}
	step("two pods, two VMs", deviceplugin.Usage{Devices: 3, HostUsed: -1, LiveVMs: 2, Counted: 2}, "+++")

	// Pod b is deleted, but its VM still runs (its shim died): the
	// scheduler no longer counts the slot, the plugin holds it back.
	if err := cs.CoreV1().Pods("default").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	step("leaked VM", deviceplugin.Usage{Devices: 3, HostUsed: -1, LiveVMs: 2, Counted: 1, Reserved: 1}, "++-")

	// Pod a has terminated while its VM is still stopping.
	var pa *corev1.Pod
	pa, err = cs.CoreV1().Pods("default").Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pa.Status.Phase = corev1.PodSucceeded
	if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, pa, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("terminated pod, VM stopping", deviceplugin.Usage{Devices: 3, HostUsed: -1, LiveVMs: 2, Counted: 0, Reserved: 2}, "+--")

	// Both QEMUs exit (their state dirs stay behind): every slot is free.
	fakevms.Exit(t, proc, 4001)
	fakevms.Exit(t, proc, 4002)
	step("VMs gone", deviceplugin.Usage{Devices: 3, HostUsed: -1}, "+++")
}

func TestPodUnits(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	req := func(n string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{labels.ResourceSNPASID: resource.MustParse(n)}}
	}
	snp := simPod("snp")
	snp.Spec.Overhead = corev1.ResourceList{labels.ResourceSNPASID: resource.MustParse("1")}
	snp.Spec.Containers = []corev1.Container{{Name: "a", Resources: req("1")}, {Name: "b", Resources: req("1")}}
	snp.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: req("3")}}
	sidecar := simPod("sidecar")
	sidecar.Spec.Overhead = nil
	sidecar.Spec.InitContainers = []corev1.Container{{Name: "side", RestartPolicy: &always, Resources: req("1")}, {Name: "init", Resources: req("1")}}
	sidecar.Spec.Containers = []corev1.Container{{Name: "app", Resources: req("1")}}
	failed := simPod("failed")
	failed.Status.Phase = corev1.PodFailed
	pending := simPod("pending")
	pending.Status.Phase = corev1.PodPending
	cs := fake.NewSimpleClientset(snp, sidecar, failed, pending)
	units, err := (&KubeClient{Clientset: cs, NodeName: "n1"}).PodUnits(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// snp: max(1+1, 3) + 1 overhead = 4; sidecar: max(1+1, 1+1) = 2;
	// pending: its sim slot; failed: nothing.
	if units[labels.ResourceSNPASID] != 6 || units[labels.ResourceSimSlot] != 1 {
		t.Fatalf("units = %v", units)
	}
}
