package node

import (
	"context"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
)

// TestKubeClientReconcilesANode runs the agent through client-go against
// the fake clientset, whose object tracker applies merge patches as the
// API server does: labels and taint land on the Node, a foreign taint
// and label stay, the EPC capacity lands in the status, and a second pass
// sends nothing.
func TestKubeClientReconcilesANode(t *testing.T) {
	foreign := corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoExecute}
	cs := fake.NewSimpleClientset(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"kubernetes.io/hostname": "n1"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{foreign}},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("2"),
		}},
	})
	fixture := "sgx-host"
	taint := &labels.Taint{Key: "c8s.io/confidential", Value: "true", Effect: "NoSchedule"}
	a := &Agent{
		Client: &KubeClient{Clientset: cs, NodeName: "n1"},
		Discover: func() (discovery.Result, error) {
			return discovery.Discover(discovery.Options{Root: filepath.Join("discovery", "testdata", fixture), SimSlots: 2})
		},
		Settings: labels.Settings{Taint: taint},
	}
	ctx := context.Background()
	rep, err := a.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Patched == nil || rep.StatusPatched == nil {
		t.Fatalf("first pass patched nothing: %s %s", rep.Patched, rep.StatusPatched)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"kubernetes.io/hostname": "n1", labels.LabelSim: "true", labels.NFDSGX: "true"} {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, n.Labels[k], v, n.Labels)
		}
	}
	wantTaints := []corev1.Taint{foreign, {Key: taint.Key, Value: taint.Value, Effect: corev1.TaintEffectNoSchedule}}
	if len(n.Spec.Taints) != 2 || n.Spec.Taints[0].Key != wantTaints[0].Key || n.Spec.Taints[1] != wantTaints[1] {
		t.Errorf("taints = %v, want %v", n.Spec.Taints, wantTaints)
	}
	epc := n.Status.Capacity[corev1.ResourceName(labels.ResourceSGXEPC)]
	if epc.String() != "68451041280" || n.Status.Allocatable[corev1.ResourceName(labels.ResourceSGXEPC)] != epc {
		t.Errorf("status: capacity %v allocatable %v", n.Status.Capacity, n.Status.Allocatable)
	}
	if cpu := n.Status.Capacity[corev1.ResourceCPU]; cpu.String() != "2" {
		t.Errorf("the status patch lost the CPU capacity: %v", n.Status.Capacity)
	}

	if rep, err := a.Once(ctx); err != nil || rep.Patched != nil || rep.StatusPatched != nil {
		t.Fatalf("second pass: %s %s %v", rep.Patched, rep.StatusPatched, err)
	}

	// The node loses its TEEs: c8s's labels, its taint and the EPC go,
	// the foreign taint stays.
	fixture = "plain-host"
	a.Discover = func() (discovery.Result, error) {
		return discovery.Discover(discovery.Options{Root: filepath.Join("discovery", "testdata", fixture), SimSlots: -1})
	}
	if _, err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	n, _ = cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if _, ok := n.Labels[labels.LabelSim]; ok || n.Labels[labels.NFDSGX] != "" {
		t.Errorf("labels on the plain host: %v", n.Labels)
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != foreign.Key {
		t.Errorf("taints on the plain host: %v", n.Spec.Taints)
	}
	if _, ok := n.Status.Capacity[corev1.ResourceName(labels.ResourceSGXEPC)]; ok {
		t.Errorf("EPC capacity left: %v", n.Status.Capacity)
	}
}

func TestKubeClientMissingNode(t *testing.T) {
	k := &KubeClient{Clientset: fake.NewSimpleClientset(), NodeName: "nope"}
	if _, _, err := k.Node(context.Background()); err == nil {
		t.Fatal("reading a Node that does not exist succeeded")
	}
}

func TestNewKubeClientNeedsANodeName(t *testing.T) {
	if _, err := NewKubeClient("", ""); err == nil {
		t.Fatal("no error without a node name")
	}
}
