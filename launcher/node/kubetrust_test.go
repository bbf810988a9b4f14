package node

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/c8s-dev/c8s/launcher/node/reattest"
)

func TestSetPodCondition(t *testing.T) {
	ready := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
	cs := fake.NewSimpleClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{ready}},
	})
	k := &KubeClient{Clientset: cs, NodeName: "n1"}
	ctx := context.Background()
	p := reattest.Pod{Namespace: "default", Name: "web", UID: "u1"}
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	get := func() corev1.PodCondition {
		t.Helper()
		pod, err := cs.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out corev1.PodCondition
		n := 0
		for _, c := range pod.Status.Conditions {
			if c.Type == reattest.ConditionType {
				out, n = c, n+1
			}
			if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
				t.Errorf("the kubelet's Ready condition changed: %+v", c)
			}
		}
		if n != 1 || len(pod.Status.Conditions) != 2 {
			t.Fatalf("conditions %+v: want Ready and one %s", pod.Status.Conditions, reattest.ConditionType)
		}
		return out
	}
	set := func(s reattest.Status, reason string, at time.Time) {
		t.Helper()
		if err := k.SetPodCondition(ctx, p, reattest.Condition{Status: s, Reason: reason, Message: reason + " message", Probed: at}); err != nil {
			t.Fatal(err)
		}
	}
	set(reattest.StatusTrue, reattest.ReasonVerified, t0)
	if c := get(); c.Status != corev1.ConditionTrue || c.Reason != "Verified" || c.Message != "Verified message" || !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("condition %+v", c)
	}
	set(reattest.StatusTrue, reattest.ReasonVerified, t0.Add(time.Minute))
	if c := get(); !c.LastTransitionTime.Time.Equal(t0) || !c.LastProbeTime.Time.Equal(t0.Add(time.Minute)) {
		t.Errorf("unchanged status moved the transition time: %+v", c)
	}
	set(reattest.StatusFalse, reattest.ReasonTCBRevoked, t0.Add(2*time.Minute))
	if c := get(); c.Status != corev1.ConditionFalse || c.Reason != "TCBRevoked" || !c.LastTransitionTime.Time.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("condition %+v", c)
	}
	// A pod of the same name but another UID is another pod.
	if err := k.SetPodCondition(ctx, reattest.Pod{Namespace: "default", Name: "web", UID: "u2"}, reattest.Condition{Status: reattest.StatusTrue}); err == nil {
		t.Error("condition set on a pod with another UID")
	}
}

func TestEvents(t *testing.T) {
	cs := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid"}})
	k := &KubeClient{Clientset: cs, NodeName: "n1"}
	ctx := context.Background()
	if err := k.PodEvent(ctx, reattest.Pod{Namespace: "prod", Name: "web", UID: "u1"}, "Warning", "AttestationTCBRevoked", "revoked"); err != nil {
		t.Fatal(err)
	}
	if err := k.NodeEvent(ctx, "Warning", "TrustWithheld", "chip revoked"); err != nil {
		t.Fatal(err)
	}
	evs, _ := cs.CoreV1().Events("prod").List(ctx, metav1.ListOptions{})
	if len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Kind != "Pod" || evs.Items[0].InvolvedObject.UID != "u1" || evs.Items[0].Reason != "AttestationTCBRevoked" ||
		evs.Items[0].Type != "Warning" || evs.Items[0].Source.Host != "n1" {
		t.Errorf("pod events %+v", evs.Items)
	}
	evs, _ = cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Kind != "Node" || evs.Items[0].InvolvedObject.UID != "node-uid" || evs.Items[0].Message != "chip revoked" {
		t.Errorf("node events %+v", evs.Items)
	}
}

func TestConfigMapSource(t *testing.T) {
	cs := fake.NewSimpleClientset()
	src := ConfigMapSource{Clientset: cs, Namespace: "c8s-system", ConfigMap: "trust"}
	ctx := context.Background()
	if _, err := src.Read(ctx); !errors.Is(err, reattest.ErrNoBundle) {
		t.Errorf("no ConfigMap: %v", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "c8s-system", Name: "trust"}, Data: map[string]string{"other": "x"}}
	if _, err := cs.CoreV1().ConfigMaps("c8s-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Read(ctx); !errors.Is(err, reattest.ErrNoBundle) {
		t.Errorf("no key: %v", err)
	}
	cm.Data[DefaultBundleKey] = "a.b.c"
	if _, err := cs.CoreV1().ConfigMaps("c8s-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := src.Read(ctx); err != nil || string(b) != "a.b.c" {
		t.Errorf("read %q %v", b, err)
	}
	if src.Name() != "ConfigMap c8s-system/trust key bundle.jws" {
		t.Errorf("name %q", src.Name())
	}
}
