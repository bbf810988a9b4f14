package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/c8s-dev/c8s/launcher/node/deviceplugin"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
	"github.com/c8s-dev/c8s/launcher/node/reattest"
)

// standing is a fixed Agent.Trust.
type standing struct{ reattest.NodeState }

func (s *standing) Node() reattest.NodeState { return s.NodeState }

// A node whose own chip or TCB falls below the owners' policy advertises
// no capacity and says why; once it satisfies the policy again, its
// capacity comes back.
func TestAgentWithholdsARevokedNode(t *testing.T) {
	dir, err := os.MkdirTemp("", "c8s-wh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	node := &fakeNode{obj: map[string]any{"metadata": map[string]any{"labels": map[string]any{"kubernetes.io/hostname": "n1"}}},
		units: map[string]int64{}}
	plugins := deviceplugin.NewManager(context.Background(), dir)
	t.Cleanup(func() { _ = plugins.Stop() })
	trust := &standing{}
	a := &Agent{
		Client: node,
		Discover: func() (discovery.Result, error) {
			return discovery.Discover(discovery.Options{Root: filepath.Join("discovery", "testdata", "snp-host"), SimSlots: 2})
		},
		Plugins: plugins,
		Trust:   trust,
	}
	ctx := context.Background()
	rep, err := a.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, _, _ := node.Node(ctx)
	if n.Labels[labels.LabelSim] != "true" || n.Labels[labels.LabelSNP] != "true" || rep.Usage[labels.ResourceSimSlot].Devices != 2 || rep.Withheld != nil {
		t.Fatalf("a node in good standing: labels %v usage %+v", n.Labels, rep.Usage)
	}
	if _, has := n.Annotations[labels.AnnotationTrustWithheld]; has || rep.WithheldPatched != nil {
		t.Fatalf("annotations %v", n.Annotations)
	}

	trust.NodeState = reattest.NodeState{Withheld: true, Reason: reattest.ReasonTCBRevoked, Message: "REPORTED_TCB 0x7308000000000003 is revoked"}
	if rep, err = a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	n, _, _ = node.Node(ctx)
	for _, k := range []string{labels.LabelSim, labels.LabelSNP} {
		if _, has := n.Labels[k]; has {
			t.Errorf("withheld node still labelled %s: %v", k, n.Labels)
		}
	}
	if n.Labels[labels.LabelTrustWithheld] != reattest.ReasonTCBRevoked || n.Labels[labels.LabelTrustPool] != "snp" {
		t.Errorf("labels %v", n.Labels)
	}
	for _, r := range rep.Desired.Resources {
		if r.Count != 0 {
			t.Errorf("resource %s advertised %d units on a withheld node", r.Name, r.Count)
		}
	}
	for _, res := range []string{labels.ResourceSimSlot, labels.ResourceSNPASID} {
		if u := rep.Usage[res]; u.Devices != 0 {
			t.Errorf("%s: %d devices served on a withheld node", res, u.Devices)
		}
	}
	if got := n.Annotations[labels.AnnotationTrustWithheld]; got != "TCBRevoked: REPORTED_TCB 0x7308000000000003 is revoked" {
		t.Errorf("annotation %q", got)
	}
	if rep, _ := a.Once(ctx); rep.Patched != nil || rep.WithheldPatched != nil {
		t.Errorf("unchanged standing patched again: %s %s", rep.Patched, rep.WithheldPatched)
	}

	trust.NodeState = reattest.NodeState{}
	if rep, err = a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	n, _, _ = node.Node(ctx)
	if n.Labels[labels.LabelSim] != "true" || rep.Usage[labels.ResourceSimSlot].Devices != 2 {
		t.Errorf("restored node: labels %v usage %+v", n.Labels, rep.Usage)
	}
	if _, has := n.Labels[labels.LabelTrustWithheld]; has {
		t.Errorf("labels %v", n.Labels)
	}
	if _, has := n.Annotations[labels.AnnotationTrustWithheld]; has {
		t.Errorf("annotations %v", n.Annotations)
	}
}
