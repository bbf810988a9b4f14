package node

import (
	"bytes"
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	sevclient "github.com/google/go-sev-guest/client"
	sevtest "github.com/google/go-sev-guest/testing"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	guestattest "github.com/c8s-dev/c8s/guest/attest"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/attest/fakecvm"
	"github.com/c8s-dev/c8s/launcher/node/cvm"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
)

// TestNodeAsCVMAnnotations runs the agent on the snp-guest fixture tree
// against the fake clientset: the node attests itself through
// go-sev-guest's fake sev-guest device, and the verified digest and TCB
// land on the Node; they are refreshed after the interval, replaced by the
// reason when verification fails, and removed when the node is no longer
// a CVM.
func TestNodeAsCVMAnnotations(t *testing.T) {
	cs := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: "cvm1", Annotations: map[string]string{"example.com/keep": "yes"},
	}})
	fixture := "snp-guest"
	root := func() string { return filepath.Join("discovery", "testdata", fixture) }
	signer := fakecvm.Signer(t, sevtest.DefaultAmdKeys())
	nonce := bytes.Repeat([]byte{0x5a}, 32)
	device := fakecvm.Device(t, signer, nonce, fakecvm.Policy)
	verifier, err := attest.NewVerifier(attest.Trust{Mode: attest.ModeSNP, SNPRoots: fakecvm.RootsPEM(signer)})
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 11, 29, 22, 0, 0, 0, time.UTC)
	var att *cvm.Attester
	a := &Agent{
		Client: &KubeClient{Clientset: cs, NodeName: "cvm1"},
		Discover: func() (discovery.Result, error) {
			return discovery.Discover(discovery.Options{Root: root(), SimSlots: -1})
		},
		NodeCVM: func(c discovery.NodeCVMInfo) (*cvm.Attester, error) {
			x, err := cvm.New(root(), c, cvm.Policy{MinTCB: fakecvm.TCBValue(t, fakecvm.TCB)})
			if err != nil {
				return nil, err
			}
			src, ok := x.Source.(*guestattest.SEVGuest)
			if !ok || src.Path() != filepath.Join(root(), "dev/sev-guest") {
				t.Fatalf("evidence source on the snp-guest fixture: %#v", x.Source)
			}
			// The fake device and the fake chip's roots stand in for
			// the kernel's device and AMD's roots.
			x.Source = guestattest.NewSEVGuestWith(src.Path(), func(path string) (sevclient.Device, error) { return device, device.Open(path) })
			x.Verifier = verifier
			x.Nonce = func() (attest.Hex, error) { return nonce, nil }
			x.Now = func() time.Time { return clock }
			att = x
			return x, nil
		},
		NodeCVMInterval: 10 * time.Minute,
		Now:             func() time.Time { return clock },
	}
	ctx := context.Background()
	annotations := func() map[string]string {
		t.Helper()
		n, err := cs.CoreV1().Nodes().Get(ctx, "cvm1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels[labels.LabelTrustShape] != labels.ShapeNodeAsCVM && fixture == "snp-guest" {
			t.Errorf("labels of the node-as-CVM: %v", n.Labels)
		}
		return n.Annotations
	}
	digest := attest.Hex(fakecvm.Digest).String()
	verified := func(at string) map[string]string {
		return map[string]string{
			"example.com/keep":      "yes",
			cvm.AnnotationTEE:       "snp",
			cvm.AnnotationDigest:    digest,
			cvm.AnnotationTCB:       "bl=3,tee=0,snp=8,ucode=115",
			cvm.AnnotationReference: "none",
			cvm.AnnotationVerified:  at,
		}
	}

	rep, err := a.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.NodeCVM == nil || !rep.NodeCVM.Verified || rep.NodeCVMPatched == nil {
		t.Fatalf("first pass: %+v %s", rep.NodeCVM, rep.NodeCVMPatched)
	}
	if got := annotations(); !reflect.DeepEqual(got, verified("2026-11-29T22:00:00Z")) {
		t.Fatalf("annotations after the first pass:\n got %v\nwant %v", got, verified("2026-11-29T22:00:00Z"))
	}

	// Within the interval the verification stands: nothing is sent.
	clock = clock.Add(5 * time.Minute)
	if rep, err := a.Once(ctx); err != nil || rep.NodeCVMPatched != nil || rep.Patched != nil {
		t.Fatalf("second pass: %s %s %v", rep.NodeCVMPatched, rep.Patched, err)
	}
	// After it, the node attests itself again.
	clock = clock.Add(6 * time.Minute)
	if _, err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if got := annotations(); !reflect.DeepEqual(got, verified("2026-11-29T22:11:00Z")) {
		t.Fatalf("annotations after the refresh:\n got %v", got)
	}

	// The operator pins another digest: the node's evidence no longer
	// passes, the digest and TCB go and the reason is published. A failed
	// verification is retried on the next pass, not after the interval.
	att.Policy.Digests = []attest.Hex{bytes.Repeat([]byte{1}, 48)}
	clock = clock.Add(11 * time.Minute)
	if _, err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	got := annotations()
	if len(got) != 3 || got[cvm.AnnotationTEE] != "snp" || got["example.com/keep"] != "yes" ||
		!strings.Contains(got[cvm.AnnotationError], "MEASUREMENT "+digest+" is not one of attestation.node_launch_digests") {
		t.Fatalf("annotations after a failed verification: %v", got)
	}
	att.Policy.Digests = []attest.Hex{fakecvm.Digest}
	clock = clock.Add(time.Minute)
	if _, err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	want := verified("2026-11-29T22:23:00Z")
	want[cvm.AnnotationReference] = "matched"
	if got := annotations(); !reflect.DeepEqual(got, want) {
		t.Fatalf("annotations after the retry:\n got %v\nwant %v", got, want)
	}

	// The node is no longer a CVM: every node-cvm annotation goes.
	fixture = "plain-host"
	if _, err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if got := annotations(); !reflect.DeepEqual(got, map[string]string{"example.com/keep": "yes"}) {
		t.Fatalf("annotations on a plain host: %v", got)
	}
}

// A node-as-CVM whose self-attestation cannot even be set up says so.
func TestNodeAsCVMSetupFailure(t *testing.T) {
	node := &fakeNode{obj: map[string]any{"metadata": map[string]any{}}}
	a := &Agent{
		Client: node,
		Discover: func() (discovery.Result, error) {
			return discovery.Discover(discovery.Options{Root: filepath.Join("discovery", "testdata", "tdx-guest"), SimSlots: -1})
		},
		NodeCVM: func(discovery.NodeCVMInfo) (*cvm.Attester, error) { return nil, nil },
	}
	if _, err := a.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	n, _, _ := node.Node(context.Background())
	if len(n.Annotations) != 2 || n.Annotations[cvm.AnnotationTEE] != "tdx" || n.Annotations[cvm.AnnotationError] != "no evidence source for a tdx guest" {
		t.Fatalf("annotations: %v", n.Annotations)
	}
}
