package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/c8s-dev/c8s/launcher/node/labels"
	"github.com/c8s-dev/c8s/packaging"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

// TestKubernetesSchedulesConfidentialGPUs: the confidential GPU resource
// from fixture discovery reaches a real kube-scheduler. No GPU exists on
// this machine: the node agent reads sysfs from the gpu-one fixture tree
// (one H100 SXM5 in CC mode on vfio-pci, launcher/node/discovery/testdata)
// through --root, and serves nvidia.com/confidential-gpu to the real
// kubelet. The test checks that the Node gets the resource and the NVIDIA
// labels; that a c8s-sim-gpu pod asking for one GPU is scheduled onto the
// node, the kubelet allocates it the fixture GPU 0000:41:00.0, and the c8s
// shim, which asks the kubelet's PodResources API for the pod's GPUs when
// it starts the pod VM, refuses to start it because that GPU is not on the
// host (what really happens here: no VM boots); and that a pod asking for
// two stays Pending with the scheduler's "Insufficient
// nvidia.com/confidential-gpu".
func TestKubernetesSchedulesConfidentialGPUs(t *testing.T) {
	root, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	fixture := filepath.Join(root, "launcher", "node", "discovery", "testdata", "gpu-one")
	if _, err := os.Stat("/sys/bus/pci/devices/0000:41:00.0"); err == nil {
		t.Fatal("this host has a PCI device 0000:41:00.0, the fixture GPU's address: the test would pass it to a VM")
	}
	e, c, dir := startK8sNode(t, "c8s-k8sgpu-", fixture)
	t.Cleanup(func() { os.Remove(filepath.Join(c.pluginDir, "c8s-confidential-gpu.sock")) })
	ctx := context.Background()
	nodes := c.cs.CoreV1().Nodes()
	pods := c.cs.CoreV1().Pods("default")

	// The sim handler's shim asks this kubelet (its --root-dir) for the
	// pods' devices.
	simCfg := filepath.Join(dir, "etc", "c8s", "config-sim.toml")
	f, err := os.OpenFile(simCfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(f, "\n[devices]\npod_resources_socket = %q\n", filepath.Join(c.kubeletDir, "pod-resources", "kubelet.sock")); err != nil {
		t.Fatal(err)
	}
	f.Close()

	// Two sim slots: the GPU, not the slot, is what the second pod lacks.
	agentCfg := filepath.Join(dir, "node-agent.toml")
	if err := os.WriteFile(agentCfg, fmt.Appendf(nil, "[node]\nsim_slots = 2\n[runtime]\nstate_dir = %q\n", e.stateDir), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start(t, "c8s-launcher", "node-agent", "--kubeconfig="+c.kubeconfig, "--node-name="+c.node,
		"--config="+agentCfg, "--root="+fixture, "--device-plugin-dir="+c.pluginDir,
		"--pod-resources-socket="+filepath.Join(c.kubeletDir, "pod-resources", "kubelet.sock"), "--interval=2s")
	gpu := corev1.ResourceName(labels.ResourceConfidentialGPU)
	c.wait(t, "the fixture GPU and its labels on the Node", 2*time.Minute, func(ctx context.Context) (bool, error) {
		n, err := nodes.Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		gpus := n.Status.Allocatable[gpu]
		return gpus.Value() == 1 && n.Labels[labels.LabelGPUCCCapable] == "true" && n.Labels[labels.LabelGPUCCModeState] == "on" &&
			n.Labels[labels.LabelGPUProduct] == "NVIDIA-H100-SXM5-80GB" && n.Labels[labels.LabelSim] == "true", nil
	}, func() string {
		n, _ := nodes.Get(ctx, c.node, metav1.GetOptions{})
		return fmt.Sprintf("node labels %v allocatable %v\nnode agent log:\n%s\nkubelet log (device plugins):\n%s",
			n.Labels, n.Status.Allocatable, c.logTail("c8s-launcher", 20), c.logGrep("kubelet", 30, "plugin", "Plugin", "confidential-gpu"))
	})

	createRuntimeClasses(t, c)
	createPackagedRuntimeClasses(t, c, "kubernetes/runtimeclasses-gpu.yaml")
	diag := func(name string) func() string {
		return func() string {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			var b strings.Builder
			fmt.Fprintf(&b, "pod %s: phase %s node %q conditions %v\n", name, p.Status.Phase, p.Spec.NodeName, p.Status.Conditions)
			evs, _ := c.cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			for _, ev := range evs.Items {
				fmt.Fprintf(&b, "  event %s %s: %s\n", ev.Type, ev.Reason, ev.Message)
			}
			return b.String() + "kubelet log:\n" + c.logTail("kubelet", 30) + "\ncontainerd log:\n" + tail(e.d.Log(), 20)
		}
	}

	// One GPU: scheduled here, allocated the fixture GPU, which the shim
	// will not pass to a VM because the host has no such device.
	mustCreate(t, c, gpuPod("gpu1", 1))
	c.wait(t, "pod gpu1 scheduled onto the node", 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "gpu1", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == c.node, err
	}, diag("gpu1"))
	want := "was allocated GPU 0000:41:00.0, which is not an NVIDIA GPU on this host"
	c.wait(t, "the shim refusing the fixture GPU (from the kubelet's PodResources)", 3*time.Minute, func(ctx context.Context) (bool, error) {
		evs, err := c.cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=gpu1"})
		if err != nil {
			return false, err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "FailedCreatePodSandBox" && strings.Contains(ev.Message, want) {
				return true, nil
			}
		}
		return false, nil
	}, diag("gpu1"))
	if q := e.qemus(t); len(q) != 0 {
		t.Fatalf("QEMU processes for a pod whose GPU is not on the host: %v", q)
	}
	deletePod(t, c, "gpu1")

	// Two GPUs on a one-GPU node: Pending, for the GPU.
	mustCreate(t, c, gpuPod("gpu2", 2))
	c.wait(t, "pod gpu2 unschedulable for want of a second GPU", 2*time.Minute,
		unschedulable(c, "gpu2", "Insufficient "+labels.ResourceConfidentialGPU), diag("gpu2"))
	deletePod(t, c, "gpu2")
	e.assertNothingLeft(t)
}

// gpuPod is testPod in c8s-sim-gpu with n confidential GPUs.
func gpuPod(name string, n int64) *corev1.Pod {
	p := testPod(name, "c8s-sim-gpu")
	q := *resource.NewQuantity(n, resource.DecimalSI)
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{labels.ResourceConfidentialGPU: q}
	return p
}

// createPackagedRuntimeClasses creates the RuntimeClasses of a packaged
// manifest.
func createPackagedRuntimeClasses(t *testing.T, c *cluster, name string) {
	t.Helper()
	text, err := packaging.Render(name, packaging.Paths{})
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(text))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		b, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		var rc nodev1.RuntimeClass
		if err := sigsyaml.UnmarshalStrict(b, &rc); err != nil {
			t.Fatal(err)
		}
		if _, err := c.cs.NodeV1().RuntimeClasses().Create(context.Background(), &rc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create RuntimeClass %s: %v", rc.Name, err)
		}
	}
}
