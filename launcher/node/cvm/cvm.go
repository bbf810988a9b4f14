// Package cvm lets a node that is itself a confidential VM
// (node-as-CVM) vouch for itself on its Node object. It asks the node's
// own secure processor for evidence bound to a fresh nonce (configfs-tsm,
// or the sev-guest / tdx_guest device, through guest/attest's providers,
// as any confidential guest does), verifies it with launcher/attest
// against the vendor's roots and the node's [attestation] policy
// (min_tcb; debug guests refused unless allow_debug; node_launch_digests
// when set), and turns the outcome into annotations:
//
//	c8s.io/node-cvm.tee             snp | tdx
//	c8s.io/node-cvm.launch-digest   SNP MEASUREMENT or TDX MRTD, hex      (verified only)
//	c8s.io/node-cvm.tcb             SNP REPORTED_TCB as bl=,tee=,snp=,ucode=,
//	                                TDX TEE_TCB_SVN as hex                 (verified only)
//	c8s.io/node-cvm.reference       matched: the digest is one of attestation.node_launch_digests;
//	                                none: no reference is configured       (verified only)
//	c8s.io/node-cvm.verified-at     RFC 3339 time of the verification      (verified only)
//	c8s.io/node-cvm.error           why the evidence did not verify        (failure only)
//
// A digest is never published unless its evidence verified: on failure
// the digest, TCB, reference and time are removed and the error is set.
// When the node is no longer a CVM, every c8s.io/node-cvm.* annotation is
// removed.
package cvm

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"

	guestattest "github.com/c8s-dev/c8s/guest/attest"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
)

// Annotation keys.
const (
	Prefix              = "c8s.io/node-cvm."
	AnnotationTEE       = Prefix + "tee"
	AnnotationDigest    = Prefix + "launch-digest"
	AnnotationTCB       = Prefix + "tcb"
	AnnotationReference = Prefix + "reference"
	AnnotationVerified  = Prefix + "verified-at"
	AnnotationError     = Prefix + "error"
)

// Reference values.
const (
	ReferenceMatched = "matched"
	ReferenceNone    = "none"
)

// Policy is what the node's own evidence must show.
type Policy struct {
	// Digests are the accepted launch digests (48 bytes each); empty
	// accepts any (reference "none").
	Digests []attest.Hex
	// MinTCB is the minimum SNP TCB_VERSION (0: none); TDX nodes are not
	// checked against it (launcher/attest has no TDX TCB policy).
	MinTCB uint64
	// AllowDebug accepts a node launched with debugging enabled.
	AllowDebug bool
}

// PolicyFromConfig returns the policy of the config's [attestation] table.
func PolicyFromConfig(a config.Attestation) (Policy, error) {
	p := Policy{MinTCB: a.MinTCB, AllowDebug: a.AllowDebug}
	for i, s := range a.NodeLaunchDigests {
		h, err := attest.ParseHex(s)
		if err != nil {
			return p, fmt.Errorf("attestation.node_launch_digests[%d]: %w", i, err)
		}
		p.Digests = append(p.Digests, h)
	}
	return p, nil
}

// Result is one self-attestation.
type Result struct {
	TEE string
	// Verified is true when the evidence verified; then Digest, TCB,
	// Reference and At are set, else Err says why not.
	Verified  bool
	Digest    attest.Hex
	TCB       string
	Reference string
	At        time.Time
	Err       error
}

// Annotations renders r as the node's c8s.io/node-cvm.* annotations.
func (r Result) Annotations() map[string]string {
	a := map[string]string{AnnotationTEE: r.TEE}
	if !r.Verified {
		msg := "evidence did not verify"
		if r.Err != nil {
			msg = r.Err.Error()
		}
		a[AnnotationError] = msg
		return a
	}
	a[AnnotationDigest] = r.Digest.String()
	a[AnnotationTCB] = r.TCB
	a[AnnotationReference] = r.Reference
	a[AnnotationVerified] = r.At.UTC().Format(time.RFC3339)
	return a
}

// Attester verifies the node's own evidence.
type Attester struct {
	Source Source
	// Verifier checks the evidence; its mode must be the node's TEE
	// (attest.TrustFor).
	Verifier *attest.Verifier
	Policy   Policy
	// Nonce returns a fresh challenge (nil: attest.NewNonce).
	Nonce func() (attest.Hex, error)
	// Now is the clock for Result.At (nil: time.Now).
	Now func() time.Time
}

// New returns the Attester for a node-as-CVM that discovery found under
// root, verifying against the vendor's roots; nil when the node is not a
// CVM.
func New(root string, c discovery.NodeCVMInfo, p Policy) (*Attester, error) {
	src := SourceFor(root, c)
	if src == nil {
		return nil, nil
	}
	t, err := attest.TrustFor(c.TEE, "")
	if err != nil {
		return nil, err
	}
	v, err := attest.NewVerifier(t)
	if err != nil {
		return nil, err
	}
	return &Attester{Source: src, Verifier: v, Policy: p}, nil
}

// Attest gets fresh evidence of the node and verifies it. A failure is in
// Result.Err, never a panic or an unverified digest.
func (a *Attester) Attest(ctx context.Context, tee string) Result {
	res := Result{TEE: tee}
	fail := func(err error) Result { res.Err = err; return res }
	newNonce := a.Nonce
	if newNonce == nil {
		newNonce = attest.NewNonce
	}
	nonce, err := newNonce()
	if err != nil {
		return fail(err)
	}
	if len(nonce) == 0 || len(nonce) > 64 {
		return fail(fmt.Errorf("node-cvm: nonce of %d bytes, want 1 to 64", len(nonce)))
	}
	var rd [64]byte
	copy(rd[:], nonce)
	ev, err := a.Source.Evidence(ctx, rd)
	if err != nil {
		return fail(err)
	}
	if ev.Kind != tee {
		return fail(fmt.Errorf("node-cvm: discovery says the node is a %s guest but %s returned %s evidence", tee, ev.Provider, ev.Kind))
	}
	switch tee {
	case discovery.SNP:
		err = a.verifySNP(ev, nonce, &res)
	case discovery.TDX:
		err = a.verifyTDX(ev, nonce, &res)
	default:
		err = fmt.Errorf("node-cvm: no self-attestation for TEE %q", tee)
	}
	if err != nil {
		return Result{TEE: tee, Err: err}
	}
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	res.Verified, res.At = true, now()
	return res
}

// reference returns the policy digest equal to got (and "matched"), got
// itself when the policy lists none (and "none"), or an error.
func (a *Attester) reference(got []byte, field string) (attest.Hex, string, error) {
	if len(a.Policy.Digests) == 0 {
		return got, ReferenceNone, nil
	}
	for _, d := range a.Policy.Digests {
		if string(d) == string(got) {
			return d, ReferenceMatched, nil
		}
	}
	want := make([]string, len(a.Policy.Digests))
	for i, d := range a.Policy.Digests {
		want[i] = d.String()
	}
	return nil, "", fmt.Errorf("%s %x is not one of attestation.node_launch_digests (%s): the node runs other firmware, kernel or command line than expected",
		field, got, strings.Join(want, ", "))
}

func (a *Attester) verifySNP(ev *guestattest.Evidence, nonce attest.Hex, res *Result) error {
	if len(ev.Report) < abi.ReportSize {
		return fmt.Errorf("node-cvm: %s returned %d bytes, not an SNP report", ev.Provider, len(ev.Report))
	}
	report := ev.Report[:abi.ReportSize]
	// Only to find the reference the policy compares with; the verifier
	// checks the signature over this same measurement.
	r, err := abi.ReportToProto(report)
	if err != nil {
		return fmt.Errorf("node-cvm: SNP report: %w", err)
	}
	digest, ref, err := a.reference(r.GetMeasurement(), "MEASUREMENT")
	if err != nil {
		return err
	}
	claims, err := a.Verifier.VerifySNP(report, ev.CertTable, &attest.Policy{
		Measurements: map[int]attest.Hex{1: digest},
		MinTCB:       a.Policy.MinTCB,
		AllowDebug:   a.Policy.AllowDebug,
		Nonce:        nonce,
	})
	if err != nil {
		return err
	}
	t := kds.DecomposeTCBVersion(kds.TCBVersion(claims.ReportedTCB))
	res.Digest = slices.Clone(claims.Measurement)
	res.TCB = fmt.Sprintf("bl=%d,tee=%d,snp=%d,ucode=%d", t.BlSpl, t.TeeSpl, t.SnpSpl, t.UcodeSpl)
	res.Reference = ref
	return nil
}

func (a *Attester) verifyTDX(ev *guestattest.Evidence, nonce attest.Hex, res *Result) error {
	q, err := attest.ParseTDXQuote(ev.Report)
	if err != nil {
		return err
	}
	mrtd, ref, err := a.reference(q.GetTdQuoteBody().GetMrTd(), "MRTD")
	if err != nil {
		return err
	}
	claims, err := a.Verifier.VerifyTDX(ev.Report, &attest.Policy{MRTD: mrtd, AllowDebug: a.Policy.AllowDebug, Nonce: nonce})
	if err != nil {
		return err
	}
	res.Digest = slices.Clone(claims.MRTD)
	res.TCB = "tee_tcb_svn=" + claims.TeeTCBSVN.String()
	res.Reference = ref
	return nil
}

// MergePatch returns the JSON merge patch that brings the node's
// c8s.io/node-cvm.* annotations from current to want (nil want removes
// them all), or nil when nothing changes. Other annotations are never
// touched.
func MergePatch(current, want map[string]string) ([]byte, error) {
	ann := map[string]any{}
	for k, v := range want {
		if !strings.HasPrefix(k, Prefix) {
			return nil, fmt.Errorf("node-cvm: annotation %q is not under %s", k, Prefix)
		}
		if cur, ok := current[k]; !ok || cur != v {
			ann[k] = v
		}
	}
	for k := range current {
		if _, keep := want[k]; strings.HasPrefix(k, Prefix) && !keep {
			ann[k] = nil
		}
	}
	if len(ann) == 0 {
		return nil, nil
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
}
