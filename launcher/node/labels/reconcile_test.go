package labels

import (
	"reflect"
	"testing"
)

func TestReconcile(t *testing.T) {
	want := Desire(snpHost, Settings{Taint: defaultTaint})
	foreignTaint := Taint{Key: "node.kubernetes.io/unschedulable", Effect: "NoSchedule"}
	for _, tc := range []struct {
		name     string
		taintKey string // default c8s.io/confidential
		node     Node
		want     Desired
		expect   Patch
	}{
		{
			name: "fresh node gets everything",
			node: Node{Labels: map[string]string{"kubernetes.io/hostname": "n1"}},
			want: want,
			expect: Patch{
				SetLabels: map[string]string{LabelSNP: "true", LabelSim: "true", NFDSNP: "true",
					LabelTrustShape: ShapePodAsCVM, LabelTrustPool: "snp"},
				OwnedLabels: NFDSNP, OwnedChanged: true,
				Taints: []Taint{*defaultTaint}, TaintsChanged: true,
			},
		},
		{
			name: "node already as desired",
			node: Node{
				Labels: map[string]string{"kubernetes.io/hostname": "n1", LabelSNP: "true", LabelSim: "true",
					NFDSNP: "true", LabelTrustShape: ShapePodAsCVM, LabelTrustPool: "snp"},
				Annotations: map[string]string{OwnedLabelsAnnotation: NFDSNP},
				Taints:      []Taint{foreignTaint, *defaultTaint},
			},
			want:   want,
			expect: Patch{OwnedLabels: NFDSNP},
		},
		{
			name: "changed value, stale c8s label and stale owned NFD label",
			node: Node{
				Labels: map[string]string{LabelSNP: "true", LabelSim: "true", NFDSNP: "true", NFDTDX: "true",
					LabelTrustShape: ShapePodAsCVM, LabelTrustPool: "old", "c8s.io/tee.retired": "true", "team": "a"},
				Annotations: map[string]string{OwnedLabelsAnnotation: NFDSNP + "," + NFDTDX, "other": "x"},
				Taints:      []Taint{*defaultTaint},
			},
			want: want,
			expect: Patch{
				SetLabels:    map[string]string{LabelTrustPool: "snp"},
				RemoveLabels: []string{"c8s.io/tee.retired", NFDTDX},
				OwnedLabels:  NFDSNP, OwnedChanged: true,
			},
		},
		{
			name:   "NFD's own label is left alone and not claimed",
			node:   Node{Labels: map[string]string{NFDSNP: "true", NFDSGX: "true"}},
			want:   Desired{Labels: map[string]string{NFDSNP: "true"}},
			expect: Patch{},
		},
		{
			name: "node lost its TEE: c8s labels and taint go, foreign ones stay",
			node: Node{
				Labels: map[string]string{LabelSim: "true", LabelTrustShape: ShapePodAsCVM, LabelTrustPool: "sim",
					"feature.node.kubernetes.io/cpu-model.id": "1"},
				Annotations: map[string]string{OwnedLabelsAnnotation: ""},
				Taints:      []Taint{foreignTaint, *defaultTaint, {Key: "c8s.io/old", Effect: "NoExecute"}},
			},
			want: Desire(plain, Settings{Taint: defaultTaint}),
			expect: Patch{
				RemoveLabels: []string{LabelSim, LabelTrustPool, LabelTrustShape},
				Taints:       []Taint{foreignTaint}, TaintsChanged: true,
			},
		},
		{
			name:   "taint value changed",
			node:   Node{Taints: []Taint{{Key: "c8s.io/confidential", Value: "false", Effect: "NoSchedule"}}},
			want:   Desired{Taint: defaultTaint},
			expect: Patch{Taints: []Taint{*defaultTaint}, TaintsChanged: true},
		},
		{
			name:     "configured taint outside c8s.io is owned too",
			taintKey: "dedicated",
			node:     Node{Taints: []Taint{{Key: "dedicated", Value: "tee", Effect: "NoSchedule"}, foreignTaint}},
			want:     Desired{},
			expect:   Patch{Taints: []Taint{foreignTaint}, TaintsChanged: true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			taintKey := tc.taintKey
			if taintKey == "" {
				taintKey = "c8s.io/confidential"
			}
			got := Reconcile(tc.node, tc.want, taintKey)
			if !reflect.DeepEqual(got, tc.expect) {
				t.Fatalf("patch = %+v\nwant    %+v", got, tc.expect)
			}
			if got.Empty() != reflect.DeepEqual(tc.expect, Patch{OwnedLabels: tc.expect.OwnedLabels}) {
				t.Fatalf("Empty() = %v for %+v", got.Empty(), got)
			}
			// Applying the patch converges: reconciling again changes nothing.
			after := apply(tc.node, got)
			if again := Reconcile(after, tc.want, taintKey); !again.Empty() {
				t.Fatalf("second reconcile not empty: %+v", again)
			}
		})
	}
}

// apply applies p to a copy of n, as the API server would.
func apply(n Node, p Patch) Node {
	out := Node{Labels: map[string]string{}, Annotations: map[string]string{}, Taints: n.Taints}
	for k, v := range n.Labels {
		out.Labels[k] = v
	}
	for k, v := range n.Annotations {
		out.Annotations[k] = v
	}
	for k, v := range p.SetLabels {
		out.Labels[k] = v
	}
	for _, k := range p.RemoveLabels {
		delete(out.Labels, k)
	}
	if p.OwnedChanged {
		if p.OwnedLabels == "" {
			delete(out.Annotations, OwnedLabelsAnnotation)
		} else {
			out.Annotations[OwnedLabelsAnnotation] = p.OwnedLabels
		}
	}
	if p.TaintsChanged {
		out.Taints = p.Taints
	}
	return out
}

func TestMergePatch(t *testing.T) {
	if b, err := (Patch{}).MergePatch(); b != nil || err != nil {
		t.Fatalf("empty patch = %s, %v", b, err)
	}
	p := Patch{
		SetLabels:    map[string]string{LabelSim: "true"},
		RemoveLabels: []string{NFDTDX},
		OwnedChanged: true,
		Taints:       nil, TaintsChanged: true,
	}
	b, err := p.MergePatch()
	if err != nil {
		t.Fatal(err)
	}
	got := mustJSON(t, b)
	want := map[string]any{
		"metadata": map[string]any{
			"labels":      map[string]any{LabelSim: "true", NFDTDX: nil},
			"annotations": map[string]any{OwnedLabelsAnnotation: nil},
		},
		"spec": map[string]any{"taints": []any{}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("merge patch = %s", b)
	}
	b, err = (Patch{Taints: []Taint{*defaultTaint}, TaintsChanged: true, OwnedLabels: NFDSNP, OwnedChanged: true}).MergePatch()
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"metadata":{"annotations":{"c8s.io/owned-labels":"`+NFDSNP+`"}},"spec":{"taints":[{"key":"c8s.io/confidential","value":"true","effect":"NoSchedule"}]}}` {
		t.Fatalf("merge patch = %s", b)
	}
}
