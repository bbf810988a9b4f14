package reattest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/launcher/attest"
)

func TestPodThatPassesGetsAttestedTrue(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	m := n.monitor(o)
	pass := once(t, m)
	if len(pass.Results) != 1 {
		t.Fatalf("pass %+v: want one pod re-attested", pass)
	}
	c := n.condition("web")
	if c.Status != StatusTrue || c.Reason != ReasonVerified || !strings.Contains(c.Message, goodDigest.String()) || !c.Probed.Equal(n.now) {
		t.Errorf("condition %+v, want True/Verified naming the launch digest, probed now", c)
	}
	if ev := n.podEvents["web"]; !slices.Equal(ev, []string{"Normal AttestationVerified"}) {
		t.Errorf("events %v", ev)
	}
	if m.Node().Withheld || len(n.stopped) != 0 {
		t.Errorf("node %+v stopped %v", m.Node(), n.stopped)
	}
}

// The pod is re-attested every Interval, not at every scan, each time
// with a new nonce.
func TestReattestsEveryIntervalWithAFreshNonce(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	m := n.monitor(o)
	once(t, m)
	n.advance(9 * time.Minute)
	if pass := once(t, m); len(pass.Results) != 0 {
		t.Fatalf("re-attested before the interval: %+v", pass.Results)
	}
	n.advance(time.Minute)
	if pass := once(t, m); len(pass.Results) != 1 || pass.Results[0].Verdict.Status != StatusTrue {
		t.Fatalf("not re-attested after the interval: %+v", pass.Results)
	}
	if len(n.nonces) != 2 || bytes.Equal(n.nonces[0], n.nonces[1]) || len(n.nonces[0]) != attest.NonceSize {
		t.Errorf("nonces %x: want two different fresh ones", n.nonces)
	}
	if len(n.podEvents["web"]) != 1 {
		t.Errorf("events %v: an unchanged verdict is not an event again", n.podEvents["web"])
	}
}

// Evidence for another nonce (a replay of an earlier answer) fails.
func TestReplayedEvidenceFails(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	n.replay = bytes.Repeat([]byte{9}, 32)
	once(t, n.monitor(o))
	if c := n.condition("web"); c.Status != StatusFalse || c.Reason != ReasonEvidenceRejected || !strings.Contains(c.Message, "REPORT_DATA") {
		t.Errorf("condition %+v, want False/EvidenceRejected naming REPORT_DATA", c)
	}
}

// A revoked TCB published while the pod runs: at the next scan the pod is
// False with the reason and the node is withheld; with on_failure report
// the pod keeps running.
func TestRevokedTCBPublished(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	m := n.monitor(o)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusTrue {
		t.Fatalf("before the revocation: %+v", c)
	}
	o.publish(Bundle{Serial: 1, Revoked: Revoked{TCBs: []TCB{n.tcb()}}}, nil)
	n.advance(DefaultScan)
	pass := once(t, m)
	if !pass.BundleChanged || pass.Bundle != 1 || len(pass.Results) != 1 {
		t.Fatalf("pass %+v: want the new bundle taken and the pod re-attested at once", pass)
	}
	c := n.condition("web")
	if c.Status != StatusFalse || c.Reason != ReasonTCBRevoked || !strings.Contains(c.Message, n.tcb().String()) || !strings.Contains(c.Message, "serial 1") {
		t.Errorf("condition %+v, want False/TCBRevoked naming the TCB and the bundle", c)
	}
	if ev := n.podEvents["web"]; !slices.Contains(ev, "Warning AttestationTCBRevoked") {
		t.Errorf("pod events %v", ev)
	}
	if ns := m.Node(); !ns.Withheld || ns.Reason != ReasonTCBRevoked {
		t.Errorf("node %+v: want withheld for the revoked TCB", ns)
	}
	if !slices.Contains(n.nodeEvents, "Warning TrustWithheld") || !slices.Contains(n.nodeEvents, "Normal TrustBundleApplied") {
		t.Errorf("node events %v", n.nodeEvents)
	}
	if len(n.stopped) != 0 {
		t.Errorf("stopped %v under on_failure report", n.stopped)
	}

	// Lifting the revocation in a newer bundle restores the node and the pod.
	o.publish(Bundle{Serial: 2}, nil)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusTrue || m.Node().Withheld {
		t.Errorf("after the revocation was lifted: condition %+v node %+v", c, m.Node())
	}
}

func TestChipRevokedWithholdsTheNode(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	o.publish(Bundle{Serial: 1, Revoked: Revoked{ChipIDs: []attest.Hex{n.chipID()}}}, nil)
	m := n.monitor(o)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusFalse || c.Reason != ReasonChipRevoked {
		t.Errorf("condition %+v", c)
	}
	if ns := m.Node(); !ns.Withheld || ns.Reason != ReasonChipRevoked {
		t.Errorf("node %+v", ns)
	}
}

// The bundle's minimum TCB, and the node's, are compared component by
// component.
func TestMinimumTCB(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	p := n.sp.TCB()
	p.UcodeSpl++
	higher := mustCompose(t, p)
	o.publish(Bundle{Serial: 1, MinTCB: higher}, nil)
	m := n.monitor(o)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusFalse || c.Reason != ReasonTCBBelowMinimum || !strings.Contains(c.Message, "ucode=") {
		t.Errorf("condition %+v", c)
	}
	if !m.Node().Withheld {
		t.Error("node not withheld below the minimum TCB")
	}
	// The node's own floor counts without a bundle too.
	n2, o2 := newNode(t), newOwner(t)
	n2.run("sb1", "web")
	m2 := n2.monitor(o2)
	m2.Checker.MinTCB = uint64(higher)
	once(t, m2)
	if c := n2.condition("web"); c.Reason != ReasonTCBBelowMinimum || !strings.Contains(c.Message, "attestation.min_tcb") {
		t.Errorf("node floor: condition %+v", c)
	}
	// At the minimum passes.
	n3, o3 := newNode(t), newOwner(t)
	n3.run("sb1", "web")
	o3.publish(Bundle{Serial: 1, MinTCB: n3.tcb()}, nil)
	once(t, n3.monitor(o3))
	if c := n3.condition("web"); c.Status != StatusTrue {
		t.Errorf("at the minimum: %+v", c)
	}
}

// on_failure = "stop": a pod whose init data digest is revoked is
// stopped through the runtime; it is a pod's failure, not the node's. The
// sandbox the kubelet starts again for the pod is checked at once and
// stopped too.
func TestStopPolicy(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	n.run("sb2", "other")
	m := n.monitor(o)
	once(t, m)
	hd := initdata.Digest(podInitData)
	o.publish(Bundle{Serial: 1, OnFailure: OnFailureStop, Revoked: Revoked{InitData: []attest.Hex{hd[:]}}}, nil)
	pass := once(t, m)
	if !slices.Equal(n.stopped, []string{"sb1", "sb2"}) {
		t.Fatalf("stopped %v, want both pods (same init data)", n.stopped)
	}
	for _, r := range pass.Results {
		if !r.Stopped || r.Verdict.Reason != ReasonInitDataRevoked {
			t.Errorf("result %+v", r)
		}
	}
	if c := n.condition("web"); c.Status != StatusFalse || c.Reason != ReasonInitDataRevoked {
		t.Errorf("condition %+v", c)
	}
	if ev := n.podEvents["web"]; !slices.Contains(ev, "Warning AttestationStopped") {
		t.Errorf("events %v", ev)
	}
	if m.Node().Withheld {
		t.Error("a pod's revoked init data withheld the node")
	}
	n.run("sb3", "web")
	pass = once(t, m)
	if len(pass.Results) != 1 || pass.Results[0].Sandbox.ID != "sb3" || !pass.Results[0].Stopped {
		t.Errorf("the pod's new sandbox: %+v", pass.Results)
	}
}

// The node's default applies without a bundle saying otherwise; a
// bundle's "report" overrides a node's "stop".
func TestOnFailureDefault(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	n.measurement = otherDigest
	m := n.monitor(o)
	m.OnFailure = OnFailureStop
	once(t, m)
	if c := n.condition("web"); c.Reason != ReasonMeasurementMismatch || len(n.stopped) != 1 {
		t.Errorf("condition %+v stopped %v", c, n.stopped)
	}
	n2, o2 := newNode(t), newOwner(t)
	n2.run("sb1", "web")
	n2.measurement = otherDigest
	o2.publish(Bundle{Serial: 1, OnFailure: OnFailureReport}, nil)
	m2 := n2.monitor(o2)
	m2.OnFailure = OnFailureStop
	once(t, m2)
	if len(n2.stopped) != 0 {
		t.Errorf("stopped %v although the bundle says report", n2.stopped)
	}
}

// No evidence is Unknown, never a reason to stop.
func TestNoEvidenceIsUnknown(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	n.noEvidence = errors.New("shim gone")
	m := n.monitor(o)
	m.OnFailure = OnFailureStop
	once(t, m)
	if c := n.condition("web"); c.Status != StatusUnknown || c.Reason != ReasonEvidenceUnavailable || !strings.Contains(c.Message, "shim gone") {
		t.Errorf("condition %+v", c)
	}
	if len(n.stopped) != 0 {
		t.Errorf("stopped %v", n.stopped)
	}
	// Unknown is tried again at the next scan, not after the interval.
	n.noEvidence = nil
	n.advance(DefaultScan)
	if pass := once(t, m); len(pass.Results) != 1 || pass.Results[0].Verdict.Status != StatusTrue {
		t.Errorf("next scan: %+v", pass.Results)
	}
}

// The bundle's reference values replace the manifest's for its TEE.
func TestBundleReferenceValues(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	n.measurement = otherDigest
	m := n.monitor(o)
	once(t, m)
	if c := n.condition("web"); c.Reason != ReasonMeasurementMismatch {
		t.Fatalf("against the manifest: %+v", c)
	}
	o.publish(Bundle{Serial: 1, Reference: map[string]Reference{"sim": {Measurements: map[int]attest.Hex{1: otherDigest}}}}, nil)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusTrue || !strings.Contains(c.Message, "bundle serial 1") {
		t.Fatalf("against the bundle's reference values: %+v", c)
	}
	o.publish(Bundle{Serial: 2, Reference: map[string]Reference{"sim": {Measurements: map[int]attest.Hex{2: otherDigest}}}}, nil)
	once(t, m)
	if c := n.condition("web"); c.Reason != ReasonMeasurementMismatch || !strings.Contains(c.Message, "vCPUs=1") {
		t.Errorf("no reference for the pod's shape: %+v", c)
	}
	o.publish(Bundle{Serial: 3, Reference: map[string]Reference{"sim": {Measurements: map[int]attest.Hex{1: otherDigest}}}, Revoked: Revoked{Measurements: []attest.Hex{otherDigest}}}, nil)
	once(t, m)
	if c := n.condition("web"); c.Reason != ReasonMeasurementRevoked {
		t.Errorf("revoked launch digest: %+v", c)
	}
}

func TestExpiredBundle(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	o.publish(Bundle{Serial: 1, Issued: n.now.Add(-time.Hour), Expires: n.now.Add(time.Hour)}, nil)
	m := n.monitor(o)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusTrue {
		t.Fatalf("before expiry: %+v", c)
	}
	n.advance(time.Hour + DefaultInterval)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusFalse || c.Reason != ReasonBundleExpired {
		t.Errorf("after expiry: %+v", c)
	}
}

// A bundle that does not verify with the owner's key, that was altered,
// or that is older or equivocates, is refused: the bundle in force stays.
func TestBadBundlesAreIgnored(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "web")
	m := n.monitor(o)
	o.publish(Bundle{Serial: 2}, nil)
	once(t, m)
	revoke := Bundle{Serial: 3, Revoked: Revoked{TCBs: []TCB{n.tcb()}}}

	_, mallory, _ := ed25519.GenerateKey(rand.Reader)
	o.publish(revoke, mallory)
	pass := once(t, m)
	if pass.BundleChanged || pass.Bundle != 2 || len(pass.Rejected) != 1 || !strings.Contains(pass.Rejected[0].Error(), "verifies with none") {
		t.Fatalf("bundle signed by another key: %+v", pass)
	}
	if !slices.Contains(n.nodeEvents, "Warning TrustBundleRejected") {
		t.Errorf("node events %v", n.nodeEvents)
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	o.publish(revoke, ec)
	if pass := once(t, m); pass.Bundle != 2 || len(pass.Rejected) != 1 {
		t.Fatalf("bundle signed by another P-256 key: %+v", pass)
	}

	// The owner's signature over other content.
	o.publish(revoke, nil)
	good, _ := os.ReadFile(o.file)
	parts := strings.Split(string(good), ".")
	parts[1] = parts[1][:len(parts[1])-2] + flip(parts[1][len(parts[1])-2:])
	os.WriteFile(o.file, []byte(strings.Join(parts, ".")), 0o644)
	if pass := once(t, m); pass.Bundle != 2 || len(pass.Rejected) != 1 {
		t.Fatalf("altered bundle: %+v", pass)
	}
	if c := n.condition("web"); c.Status != StatusTrue {
		t.Errorf("a refused bundle changed the verdict: %+v", c)
	}

	// Rollback and equivocation.
	o.publish(Bundle{Serial: 1, Revoked: Revoked{TCBs: []TCB{n.tcb()}}}, nil)
	if pass := once(t, m); pass.Bundle != 2 || len(pass.Rejected) != 1 || !strings.Contains(pass.Rejected[0].Error(), "rollback") {
		t.Fatalf("older bundle: %+v", pass)
	}
	o.publish(Bundle{Serial: 2, Revoked: Revoked{TCBs: []TCB{n.tcb()}}}, nil)
	if pass := once(t, m); pass.Bundle != 2 || len(pass.Rejected) != 1 || !strings.Contains(pass.Rejected[0].Error(), "same serial") {
		t.Fatalf("other bundle with the serial in force: %+v", pass)
	}
	// A bundle removed from its source stays in force.
	os.Remove(o.file)
	if pass := once(t, m); pass.Bundle != 2 || len(pass.Rejected) != 0 {
		t.Fatalf("removed bundle: %+v", pass)
	}
	// The owner's genuine newer bundle is taken.
	o.publish(revoke, nil)
	if pass := once(t, m); pass.Bundle != 3 || !pass.BundleChanged {
		t.Fatalf("genuine bundle: %+v", pass)
	}
	if c := n.condition("web"); c.Reason != ReasonTCBRevoked {
		t.Errorf("condition %+v", c)
	}
}

// flip changes a base64url character.
func flip(s string) string {
	if s[0] == 'A' {
		return "B" + s[1:]
	}
	return "A" + s[1:]
}

// A pod whose sandbox is gone is forgotten.
func TestGoneSandboxesAreForgotten(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	sb := n.run("sb1", "web")
	m := n.monitor(o)
	once(t, m)
	n.stopped = append(n.stopped, sb.ID)
	once(t, m)
	if len(m.pods) != 0 {
		t.Errorf("state kept for gone sandboxes: %v", m.pods)
	}
}

// A node image upgrade replaces the manifest under running pods: a VM
// seen before must show the launch digest it verified with, not the new
// manifest's; a new VM is checked against the manifest. A VM showing
// another digest than before fails.
func TestLaunchDigestPinnedPerVM(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	n.run("sb1", "old")
	m := n.monitor(o)
	once(t, m)
	n.reference = otherDigest // the node's image is upgraded
	n.advance(DefaultInterval)
	once(t, m)
	if c := n.condition("old"); c.Status != StatusTrue || !strings.Contains(c.Message, "verified with before") {
		t.Errorf("running pod after the image upgrade: %+v", c)
	}
	n.run("sb2", "new") // launched from the old image all the same
	once(t, m)
	if c := n.condition("new"); c.Reason != ReasonMeasurementMismatch {
		t.Errorf("new pod against the new manifest: %+v", c)
	}
	n.measurement = otherDigest // another VM answers for sb1
	n.advance(DefaultInterval)
	once(t, m)
	if c := n.condition("old"); c.Reason != ReasonMeasurementMismatch || !strings.Contains(c.Message, goodDigest.String()) {
		t.Errorf("another launch digest behind the same sandbox: %+v", c)
	}
}

// The runtime may not know a sandbox yet whose VM already answers (CRI
// RunPodSandbox has not returned): the pod is reported once it does.
func TestPodReportedOnceTheRuntimeKnowsIt(t *testing.T) {
	n, o := newNode(t), newOwner(t)
	sb := n.run("sb1", "web")
	p := n.pods[sb.ID]
	delete(n.pods, sb.ID)
	m := n.monitor(o)
	if pass := once(t, m); len(pass.Results) != 1 || pass.Results[0].Verdict.Status != StatusTrue || pass.Results[0].Pod.Name != "" {
		t.Fatalf("first pass: %+v", pass.Results)
	}
	n.pods[sb.ID] = p
	n.advance(DefaultScan)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusTrue {
		t.Errorf("condition %+v", c)
	}
	n.advance(DefaultScan)
	if pass := once(t, m); len(pass.Results) != 0 {
		t.Errorf("a reported pod re-attested before the interval: %+v", pass.Results)
	}
}
