package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/kds"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/node/labels"
	"github.com/c8s-dev/c8s/launcher/node/reattest"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// TestK8sReattestRevocation proves that trust is kept while a pod runs,
// on the real kubelet path: a one-node cluster on containerd with the
// packaged c8s handlers and `c8s-launcher node-agent` re-attesting the
// node's pods (scan every 2 s) under the owner's trust bundle file and
// public key. One c8s-sim pod VM boots.
//
//   - The running pod gets c8s.io/Attested=True (Verified): fresh evidence
//     from its shim's Admin API, verified against the image manifest.
//   - The owner publishes a bundle (serial 1, on_failure = "stop",
//     nothing revoked): taken (TrustBundleApplied), the pod stays True.
//   - A bundle revoking the node's TCB signed with another key replaces
//     the file: refused (TrustBundleRejected), the pod keeps running and
//     stays True, the node keeps its sim slot.
//   - The owner's bundle serial 2 revoking the TCB the pod's VM reports
//     (the node's simulated chip's): the pod gets c8s.io/Attested=False
//     with reason TCBRevoked, the events AttestationTCBRevoked and
//     AttestationStopped, its sandbox is stopped through CRI (restart
//     policy Never: the pod fails, its QEMU is gone), and the node
//     withholds its capacity: the sim slot goes to 0, the c8s.io/tee.sim
//     label goes, c8s.io/trust-withheld=TCBRevoked and its annotation
//     say why.
func TestK8sReattestRevocation(t *testing.T) {
	e, c, dir := startK8sNode(t, "c8s-k8sr-")
	ctx := context.Background()
	nodes := c.cs.CoreV1().Nodes()
	pods := c.cs.CoreV1().Pods("default")

	// The owner's key; the node agent knows its public half.
	ownerPub, ownerKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, _ := x509.MarshalPKIXPublicKey(ownerPub)
	pubFile, bundleFile := filepath.Join(dir, "owner.pub"), filepath.Join(dir, "bundle.jws")
	if err := os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	publish := func(b reattest.Bundle, key ed25519.PrivateKey) {
		t.Helper()
		doc, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		jws, err := reattest.Sign(doc, key)
		if err != nil {
			t.Fatal(err)
		}
		tmp := bundleFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(jws), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, bundleFile); err != nil {
			t.Fatal(err)
		}
	}

	agentCfg := filepath.Join(dir, "node-agent.toml")
	if err := os.WriteFile(agentCfg, fmt.Appendf(nil, "[node]\nsim_slots = 1\n[runtime]\nstate_dir = %q\n", e.stateDir), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start(t, "c8s-launcher", "node-agent", "--kubeconfig="+c.kubeconfig, "--node-name="+c.node,
		"--config="+agentCfg, "--device-plugin-dir="+c.pluginDir,
		"--pod-resources-socket="+filepath.Join(c.kubeletDir, "pod-resources", "kubelet.sock"), "--interval=2s",
		"--containerd-address="+e.d.Address, "--reattest-interval=10m", "--reattest-scan=2s",
		"--trust-bundle="+bundleFile, "--trust-bundle-key="+pubFile)
	simSlots := func(ctx context.Context) (int64, *corev1.Node, error) {
		n, err := nodes.Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return 0, nil, err
		}
		q := n.Status.Allocatable[corev1.ResourceName(labels.ResourceSimSlot)]
		return q.Value(), n, nil
	}
	c.wait(t, "the node's sim slot", 2*time.Minute, func(ctx context.Context) (bool, error) {
		slots, _, err := simSlots(ctx)
		return slots == 1, err
	}, func() string { return "node agent log:\n" + c.logTail("c8s-launcher", 20) })
	createRuntimeClasses(t, c)

	p := testPod("attested", "c8s-sim")
	p.Spec.RestartPolicy = corev1.RestartPolicyNever
	mustCreate(t, c, p)
	attested := func(ctx context.Context) (*corev1.Pod, *corev1.PodCondition, error) {
		p, err := pods.Get(ctx, "attested", metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		for i, cond := range p.Status.Conditions {
			if string(cond.Type) == reattest.ConditionType {
				return p, &p.Status.Conditions[i], nil
			}
		}
		return p, nil, nil
	}
	events := func(ctx context.Context, kind, name string) map[string]string {
		evs, _ := c.cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name})
		out := map[string]string{}
		for _, ev := range evs.Items {
			out[ev.Reason] = ev.Type + ": " + ev.Message
		}
		return out
	}
	diag := func() string {
		p, cond, err := attested(ctx)
		var b strings.Builder
		if err != nil {
			fmt.Fprintf(&b, "pod: %v\n", err)
		} else {
			fmt.Fprintf(&b, "pod phase %s condition %+v\n", p.Status.Phase, cond)
			for _, cs := range p.Status.ContainerStatuses {
				fmt.Fprintf(&b, "  container %s: %+v\n", cs.Name, cs.State)
			}
		}
		fmt.Fprintf(&b, "pod events %v\nnode events %v\n", events(ctx, "Pod", "attested"), events(ctx, "Node", c.node))
		return b.String() + "node agent log:\n" + c.logGrep("c8s-launcher", 30, "re-attestation", "trust", "error") + "\nkubelet log:\n" + c.logTail("kubelet", 20)
	}

	c.wait(t, "pod attested running with c8s.io/Attested=True", 6*time.Minute, func(ctx context.Context) (bool, error) {
		p, cond, err := attested(ctx)
		if err != nil || p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("pod attested: %v (phase %v)", err, p.Status.Phase)
		}
		return p.Status.Phase == corev1.PodRunning && cond != nil && cond.Status == corev1.ConditionTrue && cond.Reason == reattest.ReasonVerified, nil
	}, diag)
	if q := e.qemus(t); len(q) != 1 {
		t.Fatalf("QEMU processes with the pod running: %v, want 1", q)
	}
	if _, cond, _ := attested(ctx); cond != nil {
		t.Logf("running pod: %s=%s %s: %s", cond.Type, cond.Status, cond.Reason, cond.Message)
	}

	// What the pod's VM reports: the node's simulated chip's TCB.
	sp, err := sim.Load(statedir.SimSP(e.stateDir))
	if err != nil {
		t.Fatal(err)
	}
	tcbV, err := kds.ComposeTCBParts(sp.TCB())
	if err != nil {
		t.Fatal(err)
	}
	tcb := reattest.TCB(tcbV)

	// The owner's first bundle: nothing revoked.
	publish(reattest.Bundle{Serial: 1, OnFailure: reattest.OnFailureStop}, ownerKey)
	c.wait(t, "bundle serial 1 applied", 2*time.Minute, func(ctx context.Context) (bool, error) {
		return events(ctx, "Node", c.node)["TrustBundleApplied"] != "", nil
	}, diag)

	// A forged revocation: signed with a key that is not the owner's.
	_, mallory, _ := ed25519.GenerateKey(rand.Reader)
	publish(reattest.Bundle{Serial: 2, OnFailure: reattest.OnFailureStop, Revoked: reattest.Revoked{TCBs: []reattest.TCB{tcb}}}, mallory)
	c.wait(t, "the forged bundle refused", 2*time.Minute, func(ctx context.Context) (bool, error) {
		return strings.Contains(events(ctx, "Node", c.node)["TrustBundleRejected"], "verifies with none"), nil
	}, diag)
	time.Sleep(6 * time.Second) // three more scans and node-agent passes
	if p, cond, err := attested(ctx); err != nil || p.Status.Phase != corev1.PodRunning || cond == nil || cond.Status != corev1.ConditionTrue {
		t.Fatalf("after the forged bundle: %v\n%s", err, diag())
	}
	if slots, n, err := simSlots(ctx); err != nil || slots != 1 || n.Labels[labels.LabelTrustWithheld] != "" {
		t.Fatalf("after the forged bundle the node has %d sim slots, labels %v (%v)", slots, n.Labels, err)
	}
	if q := e.qemus(t); len(q) != 1 {
		t.Fatalf("QEMU processes after the forged bundle: %v, want 1", q)
	}

	// The owner revokes the TCB while the pod runs.
	publish(reattest.Bundle{Serial: 2, OnFailure: reattest.OnFailureStop, Revoked: reattest.Revoked{TCBs: []reattest.TCB{tcb}}}, ownerKey)
	c.wait(t, "pod attested reported False (TCBRevoked) and stopped", 3*time.Minute, func(ctx context.Context) (bool, error) {
		p, cond, err := attested(ctx)
		if err != nil || cond == nil {
			return false, err
		}
		evs := events(ctx, "Pod", "attested")
		return cond.Status == corev1.ConditionFalse && cond.Reason == reattest.ReasonTCBRevoked && strings.Contains(cond.Message, tcb.String()) &&
			evs["AttestationTCBRevoked"] != "" && evs["AttestationStopped"] != "" && p.Status.Phase == corev1.PodFailed, nil
	}, diag)
	p, cond, _ := attested(ctx)
	t.Logf("after the revocation: phase %s, %s=%s %s: %s; events %v", p.Status.Phase, cond.Type, cond.Status, cond.Reason, cond.Message, events(ctx, "Pod", "attested"))
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Terminated == nil {
		t.Errorf("the pod's container after the stop: %+v", p.Status.ContainerStatuses)
	}
	e.waitNoQEMU(t, diag)

	c.wait(t, "the node withholds its capacity", 2*time.Minute, func(ctx context.Context) (bool, error) {
		slots, n, err := simSlots(ctx)
		if err != nil {
			return false, err
		}
		_, simLabel := n.Labels[labels.LabelSim]
		return slots == 0 && !simLabel && n.Labels[labels.LabelTrustWithheld] == reattest.ReasonTCBRevoked &&
			strings.Contains(n.Annotations[labels.AnnotationTrustWithheld], tcb.String()) && events(ctx, "Node", c.node)["TrustWithheld"] != "", nil
	}, func() string {
		slots, n, _ := simSlots(ctx)
		return fmt.Sprintf("sim slots %d labels %v annotations %v\n", slots, n.Labels, n.Annotations) + diag()
	})

	if _, n, err := simSlots(ctx); err == nil {
		t.Logf("node: %s=%s, %s=%q", labels.LabelTrustWithheld, n.Labels[labels.LabelTrustWithheld], labels.AnnotationTrustWithheld, n.Annotations[labels.AnnotationTrustWithheld])
	}
	deletePod(t, c, "attested")
	e.assertNothingLeft(t)
}

// waitNoQEMU waits until the test's QEMUs are gone.
func (e *env) waitNoQEMU(t *testing.T, diag func() string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for len(e.qemus(t)) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Second)
	}
	if q := e.qemus(t); len(q) > 0 {
		t.Fatalf("QEMU processes after the sandbox was stopped: %v\n%s", q, diag())
	}
}
