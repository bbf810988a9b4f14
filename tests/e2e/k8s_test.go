package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/c8s-dev/c8s/launcher/node/labels"
	"github.com/c8s-dev/c8s/packaging"
)

// TestKubernetesSchedulesPodVMs runs c8s under a real Kubernetes on this
// machine: etcd, kube-apiserver, kube-scheduler and a kubelet on a private
// containerd with the packaged c8s handlers, and `c8s-launcher node-agent`
// reporting the node with one sim slot. It checks that the agent's label,
// taint and extended resource reach the Node, that a pod without the
// toleration is not placed there, that a c8s-sim pod runs in a pod VM (its
// log through the API shows the guest kernel), that a second c8s-sim pod
// stays Pending with "Insufficient c8s.io/sim-slot", and that deleting
// the first frees the slot for it.
//
// The pods use host networking: CNI networking of pod VMs is not
// implemented, so the node has no CNI config and stays NotReady; the pods
// tolerate the kubelet's not-ready taint.
func TestKubernetesSchedulesPodVMs(t *testing.T) {
	e, c, dir := startK8sNode(t, "c8s-k8s-")
	ctx := context.Background()
	nodes := c.cs.CoreV1().Nodes()
	pods := c.cs.CoreV1().Pods("default")

	agentCfg := filepath.Join(dir, "node-agent.toml")
	// The agent scans the pod VMs' state dir, so a slot stays held until
	// its VM is gone.
	if err := os.WriteFile(agentCfg, fmt.Appendf(nil, "[node]\nsim_slots = 1\n[runtime]\nstate_dir = %q\n", e.stateDir), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start(t, "c8s-launcher", "node-agent", "--kubeconfig="+c.kubeconfig, "--node-name="+c.node,
		"--config="+agentCfg, "--device-plugin-dir="+c.pluginDir,
		"--pod-resources-socket="+filepath.Join(c.kubeletDir, "pod-resources", "kubelet.sock"), "--interval=2s")
	c.wait(t, "the node agent's label, taint and sim slot on the Node", 2*time.Minute, func(ctx context.Context) (bool, error) {
		n, err := nodes.Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		tainted := false
		for _, tn := range n.Spec.Taints {
			tainted = tainted || (tn.Key == "c8s.io/confidential" && tn.Value == "true" && tn.Effect == corev1.TaintEffectNoSchedule)
		}
		slots := n.Status.Allocatable[corev1.ResourceName(labels.ResourceSimSlot)]
		return n.Labels[labels.LabelSim] == "true" && n.Labels[labels.LabelTrustShape] == "pod-as-cvm" && tainted && slots.Value() == 1, nil
	}, func() string {
		n, _ := nodes.Get(ctx, c.node, metav1.GetOptions{})
		return fmt.Sprintf("node labels %v taints %v allocatable %v\nnode agent log:\n%s\nkubelet log (device plugins):\n%s",
			n.Labels, n.Spec.Taints, n.Status.Allocatable, c.logTail("c8s-launcher", 20), c.logGrep("kubelet", 30, "plugin", "Plugin", "sim-slot"))
	})

	createRuntimeClasses(t, c)
	diag := func(names ...string) func() string {
		return func() string {
			var b strings.Builder
			for _, name := range names {
				p, err := pods.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					fmt.Fprintf(&b, "pod %s: %v\n", name, err)
					continue
				}
				fmt.Fprintf(&b, "pod %s: phase %s node %q conditions %v\n", name, p.Status.Phase, p.Spec.NodeName, p.Status.Conditions)
				for _, cs := range p.Status.ContainerStatuses {
					fmt.Fprintf(&b, "  container %s: %+v\n", cs.Name, cs.State)
				}
				evs, _ := c.cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
				for _, ev := range evs.Items {
					fmt.Fprintf(&b, "  event %s %s: %s\n", ev.Type, ev.Reason, ev.Message)
				}
			}
			return b.String() + "kubelet log:\n" + c.logTail("kubelet", 30) + "\ncontainerd log:\n" + tail(e.d.Log(), 20)
		}
	}

	// An ordinary pod does not tolerate the taint: no node for it. (The
	// scheduler's message does not name the taint; the pod tolerates
	// the only other one, not-ready.)
	mustCreate(t, c, testPod("plain", ""))
	c.wait(t, "pod plain unschedulable for the taint", 2*time.Minute, unschedulable(c, "plain", "untolerated taint"), diag("plain"))
	deletePod(t, c, "plain")

	mustCreate(t, c, testPod("vm1", "c8s-sim"))
	c.wait(t, "pod vm1 running with its log", 5*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "vm1", metav1.GetOptions{})
		if err != nil || p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("pod vm1: %v (phase %s)", err, p.Status.Phase)
		}
		if p.Status.Phase != corev1.PodRunning {
			return false, nil
		}
		out, err := pods.GetLogs("vm1", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, fmt.Errorf("pod vm1's log: %v: %s", err, out)
		}
		return strings.TrimSpace(string(out)) != "", nil
	}, diag("vm1"))
	out, err := pods.GetLogs("vm1", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(out)), kernelRelease(t, e.imageDir); got != want {
		t.Fatalf("pod vm1's log through the API: %q, want the guest kernel release %q (host: the pod did not run in a VM)", got, want)
	}
	if q := e.qemus(t); len(q) != 1 {
		t.Fatalf("QEMU processes with pod vm1 running: %v, want 1", q)
	}

	// The one sim slot is taken: the next c8s pod waits for it.
	mustCreate(t, c, testPod("vm2", "c8s-sim"))
	c.wait(t, "pod vm2 unschedulable for want of a sim slot", 2*time.Minute, unschedulable(c, "vm2", "Insufficient "+labels.ResourceSimSlot), diag("vm2"))

	// Deleting vm1 ends its VM and frees the slot: vm2 is scheduled.
	deletePod(t, c, "vm1")
	c.wait(t, "pod vm2 scheduled once vm1 is gone", 3*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "vm2", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == c.node, err
	}, diag("vm1", "vm2"))
	// Deleted only once it runs: a pod deleted while its RunPodSandbox is
	// still booting the VM leaves the API at once, and the kubelet stops
	// that sandbox later, in its own time (its sandbox GC), which is not
	// what this test is about.
	c.wait(t, "pod vm2 running", 5*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "vm2", metav1.GetOptions{})
		if err != nil || p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("pod vm2: %v (phase %s)", err, p.Status.Phase)
		}
		return p.Status.Phase == corev1.PodRunning, nil
	}, diag("vm2"))
	deletePod(t, c, "vm2")
	e.assertNothingLeft(t)

	// A kubelet restart drops the device plugins' registrations; the
	// node agent registers the sim slot again.
	registered := func() int {
		data, _ := os.ReadFile(c.logs["c8s-launcher"])
		return strings.Count(string(data), "registered "+labels.ResourceSimSlot+" ")
	}
	before := registered()
	if before == 0 {
		t.Fatalf("the node agent never logged registering %s:\n%s", labels.ResourceSimSlot, c.logTail("c8s-launcher", 20))
	}
	c.stopKubelet()
	c.stopKubelet = c.start(t, "kubelet", c.kubeletArgs...)
	c.wait(t, "the sim slot registered again after a kubelet restart", 2*time.Minute, func(ctx context.Context) (bool, error) {
		return registered() > before, nil
	}, func() string {
		return "node agent log:\n" + c.logTail("c8s-launcher", 20) + "\nkubelet log:\n" + c.logGrep("kubelet", 30, "plugin", "Plugin", "sim-slot")
	})
}

// installHandlers writes the packaged per-TEE c8s configs under dir with
// the test's image and state paths, and returns the packaged containerd
// drop-in rendered for them (without its version line, as a fragment of
// the test containerd's config).
func installHandlers(t *testing.T, dir string, e *env) string {
	t.Helper()
	data := filepath.Join(dir, "share")
	if err := os.MkdirAll(filepath.Join(data, "c8s"), 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(e.imageDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range entries {
		if err := os.Symlink(filepath.Join(e.imageDir, ent.Name()), filepath.Join(data, "c8s", ent.Name())); err != nil {
			t.Fatal(err)
		}
	}
	paths := packaging.Paths{SysconfDir: filepath.Join(dir, "etc"), DataDir: data}
	if err := os.MkdirAll(filepath.Join(paths.SysconfDir, "c8s"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range packaging.Configs {
		body, err := packaging.Render(name, paths)
		if err != nil {
			t.Fatal(err)
		}
		body = strings.ReplaceAll(body, `state_dir = "/run/c8s"`, fmt.Sprintf("state_dir = %q", e.stateDir))
		if err := os.WriteFile(filepath.Join(paths.SysconfDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dropIn, err := packaging.Render("containerd/c8s.toml", paths)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(dropIn, "\n") {
		if !strings.HasPrefix(l, "version =") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// createRuntimeClasses creates the packaged RuntimeClasses.
func createRuntimeClasses(t *testing.T, c *cluster) {
	t.Helper()
	createPackagedRuntimeClasses(t, c, "kubernetes/runtimeclasses.yaml")
}

// testPod prints its kernel release and sleeps, with host networking and
// the local busybox image.
func testPod(name, runtimeClass string) *corev1.Pod {
	no := false
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: new(int64),
			// The node stays NotReady without CNI, and without a
			// kube-controller-manager nothing lifts the kubelet's
			// registration taint; host-network pods run regardless.
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name: "app", Image: image, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", "uname -r; exec sleep 3600"},
			}},
		},
	}
	if runtimeClass != "" {
		p.Spec.RuntimeClassName = &runtimeClass
	}
	return p
}

func mustCreate(t *testing.T, c *cluster, p *corev1.Pod) {
	t.Helper()
	if _, err := c.cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
}

// unschedulable holds once the scheduler has reported the pod
// unschedulable for a reason mentioning want.
func unschedulable(c *cluster, name, want string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		p, err := c.cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s was placed on %s", name, p.Spec.NodeName)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse &&
				cond.Reason == corev1.PodReasonUnschedulable && strings.Contains(cond.Message, want) {
				return true, nil
			}
		}
		return false, nil
	}
}

// deletePod deletes a pod and waits until it is gone (for a pod on the
// node: until the kubelet has stopped it and removed the object).
func deletePod(t *testing.T, c *cluster, name string) {
	t.Helper()
	pods := c.cs.CoreV1().Pods("default")
	if err := pods.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	c.wait(t, "pod "+name+" deleted", 3*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, func() string { return "kubelet log:\n" + c.logTail("kubelet", 30) })
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
