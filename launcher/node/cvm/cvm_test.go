package cvm

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	sevclient "github.com/google/go-sev-guest/client"
	"github.com/google/go-sev-guest/kds"
	sevtest "github.com/google/go-sev-guest/testing"
	tdxabi "github.com/google/go-tdx-guest/abi"
	tdxclient "github.com/google/go-tdx-guest/client"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	tdxtest "github.com/google/go-tdx-guest/testing"
	"github.com/google/go-tdx-guest/testing/testdata"

	guestattest "github.com/c8s-dev/c8s/guest/attest"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/attest/fakecvm"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
)

// snpNode is a node-as-CVM on signer's fake chip whose sev-guest device
// answers nonce with a report of the node launched with policy.
func snpNode(t *testing.T, signer *sevtest.AmdSigner, nonce []byte, policy uint64) *guestattest.SEVGuest {
	t.Helper()
	d := fakecvm.Device(t, signer, nonce, policy)
	return guestattest.NewSEVGuestWith("/fixture/dev/sev-guest", func(path string) (sevclient.Device, error) {
		if path != "/fixture/dev/sev-guest" {
			t.Errorf("opened %s", path)
		}
		return d, d.Open(path)
	})
}

func newVerifier(t *testing.T, tr attest.Trust) *attest.Verifier {
	t.Helper()
	v, err := attest.NewVerifier(tr)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustHex(t *testing.T, s string) attest.Hex {
	t.Helper()
	h, err := attest.ParseHex(s)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func fixedNonce(n []byte) func() (attest.Hex, error) {
	return func() (attest.Hex, error) { return n, nil }
}

var verifiedAt = time.Date(2026, 11, 29, 21, 30, 0, 0, time.UTC)

func snpAttester(t *testing.T, trusted *sevtest.AmdSigner, src Source, nonce []byte, p Policy) *Attester {
	t.Helper()
	v := newVerifier(t, attest.Trust{Mode: attest.ModeSNP, SNPRoots: fakecvm.RootsPEM(trusted)})
	return &Attester{Source: src, Verifier: v, Policy: p, Nonce: fixedNonce(nonce), Now: func() time.Time { return verifiedAt }}
}

func TestSNPNodeVerified(t *testing.T) {
	signer := fakecvm.Signer(t, sevtest.DefaultAmdKeys())
	nonce := bytes.Repeat([]byte{7}, 32)
	minTCB := fakecvm.TCBValue(t, fakecvm.TCB)
	for _, tc := range []struct {
		name    string
		digests []attest.Hex
		ref     string
	}{
		{"no reference", nil, ReferenceNone},
		{"matched", []attest.Hex{bytes.Repeat([]byte{1}, 48), fakecvm.Digest}, ReferenceMatched},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := snpAttester(t, signer, snpNode(t, signer, nonce, fakecvm.Policy), nonce, Policy{Digests: tc.digests, MinTCB: minTCB})
			res := a.Attest(context.Background(), discovery.SNP)
			if res.Err != nil || !res.Verified {
				t.Fatalf("attest: %+v", res)
			}
			want := map[string]string{
				AnnotationTEE:       "snp",
				AnnotationDigest:    attest.Hex(fakecvm.Digest).String(),
				AnnotationTCB:       fakecvm.TCBString,
				AnnotationReference: tc.ref,
				AnnotationVerified:  "2026-11-29T21:30:00Z",
			}
			if got := res.Annotations(); !equal(got, want) {
				t.Fatalf("annotations\n got %v\nwant %v", got, want)
			}
		})
	}
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Every failure publishes the TEE and the reason only: no digest.
func TestSNPNodeNotVerified(t *testing.T) {
	signer := fakecvm.Signer(t, sevtest.DefaultAmdKeys())
	nonce := bytes.Repeat([]byte{9}, 32)
	above := fakecvm.TCBValue(t, kds.TCBParts{BlSpl: 3, SnpSpl: 9, UcodeSpl: 115})
	for _, tc := range []struct {
		name   string
		a      *Attester
		reason string
	}{
		{"debug node", snpAttester(t, signer, snpNode(t, signer, nonce, fakecvm.DebugPolicy), nonce, Policy{}), "DEBUG"},
		{"debug allowed but TCB too old", snpAttester(t, signer, snpNode(t, signer, nonce, fakecvm.DebugPolicy), nonce, Policy{AllowDebug: true, MinTCB: above}), "TCB below minimum"},
		{"unexpected digest", snpAttester(t, signer, snpNode(t, signer, nonce, fakecvm.Policy), nonce, Policy{Digests: []attest.Hex{bytes.Repeat([]byte{1}, 48)}}), "is not one of attestation.node_launch_digests"},
		{"stale report", snpAttester(t, signer, snpNode(t, signer, bytes.Repeat([]byte{8}, 32), fakecvm.Policy), nonce, Policy{}), "no response"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := tc.a.Attest(context.Background(), discovery.SNP)
			if res.Verified || res.Err == nil || !strings.Contains(res.Err.Error(), tc.reason) {
				t.Fatalf("want a failure mentioning %q, got %+v", tc.reason, res)
			}
			got := res.Annotations()
			if len(got) != 2 || got[AnnotationTEE] != "snp" || got[AnnotationError] != res.Err.Error() {
				t.Fatalf("annotations of a failure: %v", got)
			}
		})
	}
}

// A report signed by another chip than the trusted roots' fails on its
// certificate chain.
func TestSNPNodeUntrustedRoot(t *testing.T) {
	signer := fakecvm.Signer(t, sevtest.DefaultAmdKeys())
	trusted := fakecvm.Signer(t, otherKeys())
	nonce := bytes.Repeat([]byte{3}, 32)
	res := snpAttester(t, trusted, snpNode(t, signer, nonce, fakecvm.Policy), nonce, Policy{}).Attest(context.Background(), discovery.SNP)
	if res.Verified || res.Err == nil || !strings.Contains(res.Err.Error(), "certificate chain") {
		t.Fatalf("untrusted root: %+v", res)
	}
}

func otherKeys() *sevtest.AmdKeys {
	// The same fixed test keys except the ARK and ASK, swapped: another
	// root that did not certify the device's VCEK.
	k := sevtest.DefaultAmdKeys()
	k.Ark, k.Ask = k.Ask, k.Ark
	return k
}

// The TDX node: go-tdx-guest's fake tdx_guest device answers with the
// Intel-signed sample quote, whose REPORT_DATA is the nonce here.
func tdxNode(t *testing.T) (*guestattest.TDXGuest, []byte) {
	t.Helper()
	q, err := tdxabi.QuoteToProto(testdata.RawQuote)
	if err != nil {
		t.Fatal(err)
	}
	rd := q.(*tdxpb.QuoteV4).GetTdQuoteBody().GetReportData()
	var in [64]byte
	copy(in[:], rd)
	tc := tdxtest.TestCase{Name: "node", Input: in, Quote: testdata.RawQuote}
	copy(tc.Report[:], testdata.RawReport)
	// The TDREPORT binds the same REPORTDATA (TDREPORT offset 128,
	// REPORTMACSTRUCT.REPORTDATA): the provider checks it does.
	copy(tc.Report[128:], rd)
	d, err := tdxtest.TcDevice([]tdxtest.TestCase{tc})
	if err != nil {
		t.Fatal(err)
	}
	return guestattest.NewTDXGuestWith("/fixture/dev/tdx_guest", func(path string) (tdxclient.Device, error) { return d, d.Open(path) }), rd
}

// The sample quote's MRTD and TEE_TCB_SVN (go-tdx-guest testdata
// tdx_prod_quote_SPR_E4.dat, read with xxd at TD quote body offsets 136
// and 0).
const (
	sampleMRTD      = "6363b8043668a3ad953278e10389574d326c6749fb78aa810ecd9336923db86f22fc00b8dcd404bc10d5e119d7215cbb"
	sampleTEETCBSVN = "03000400000000000000000000000000"
)

func TestTDXNode(t *testing.T) {
	v := newVerifier(t, attest.Trust{Mode: attest.ModeTDX, Now: func() time.Time { return time.Date(2023, time.July, 1, 1, 0, 0, 0, time.UTC) }})
	src, rd := tdxNode(t)
	a := &Attester{Source: src, Verifier: v, Nonce: fixedNonce(rd), Now: func() time.Time { return verifiedAt },
		Policy: Policy{Digests: []attest.Hex{mustHex(t, sampleMRTD)}}}
	res := a.Attest(context.Background(), discovery.TDX)
	if !res.Verified {
		t.Fatalf("TDX node: %+v", res)
	}
	want := map[string]string{
		AnnotationTEE: "tdx", AnnotationDigest: sampleMRTD, AnnotationTCB: "tee_tcb_svn=" + sampleTEETCBSVN,
		AnnotationReference: ReferenceMatched, AnnotationVerified: "2026-11-29T21:30:00Z",
	}
	if got := res.Annotations(); !equal(got, want) {
		t.Fatalf("annotations\n got %v\nwant %v", got, want)
	}
	// Another expected MRTD: refused, and no digest published.
	a.Policy.Digests = []attest.Hex{bytes.Repeat([]byte{2}, 48)}
	if res := a.Attest(context.Background(), discovery.TDX); res.Verified || !strings.Contains(res.Err.Error(), "MRTD "+sampleMRTD+" is not one of") {
		t.Fatalf("unexpected MRTD: %+v", res)
	}
	// Discovery says SNP, the evidence is TDX.
	if res := a.Attest(context.Background(), discovery.SNP); res.Verified || !strings.Contains(res.Err.Error(), "returned tdx evidence") {
		t.Fatalf("TEE mismatch: %+v", res)
	}
}

func TestPolicyFromConfig(t *testing.T) {
	p, err := PolicyFromConfig(config.Attestation{MinTCB: 5, AllowDebug: true, NodeLaunchDigests: []string{sampleMRTD}})
	if err != nil || p.MinTCB != 5 || !p.AllowDebug || len(p.Digests) != 1 || p.Digests[0].String() != sampleMRTD {
		t.Fatalf("%+v %v", p, err)
	}
	if _, err := PolicyFromConfig(config.Attestation{NodeLaunchDigests: []string{"xyz"}}); err == nil {
		t.Fatal("a bad digest passed")
	}
}

func TestSourceFor(t *testing.T) {
	if s := SourceFor("/", discovery.NodeCVMInfo{}); s != nil {
		t.Fatalf("not a CVM: %T", s)
	}
	if s, ok := SourceFor("/", discovery.NodeCVMInfo{TEE: "snp", SEVGuest: true, TSMReport: true}).(*guestattest.ConfigfsTSM); !ok || s.Name() != guestattest.NameConfigfsTSM {
		t.Fatalf("configfs-tsm on the real root: %T", s)
	}
	if s, ok := SourceFor("/fx", discovery.NodeCVMInfo{TEE: "snp", SEVGuest: true, TSMReport: true}).(*guestattest.SEVGuest); !ok || s.Path() != "/fx/dev/sev-guest" {
		t.Fatalf("SNP under a fixture root: %#v", s)
	}
	if s, ok := SourceFor("/fx", discovery.NodeCVMInfo{TEE: "tdx", TDXGuest: true}).(*guestattest.TDXGuest); !ok || s.Path() != "/fx/dev/tdx_guest" {
		t.Fatalf("TDX under a fixture root: %#v", s)
	}
}

func TestMergePatch(t *testing.T) {
	cur := map[string]string{"other": "x", AnnotationTEE: "snp", AnnotationDigest: "aa", AnnotationVerified: "t1"}
	b, err := MergePatch(cur, map[string]string{AnnotationTEE: "snp", AnnotationError: "bad"})
	if err != nil || string(b) != `{"metadata":{"annotations":{"c8s.io/node-cvm.error":"bad","c8s.io/node-cvm.launch-digest":null,"c8s.io/node-cvm.verified-at":null}}}` {
		t.Fatalf("%s %v", b, err)
	}
	if b, _ := MergePatch(cur, map[string]string{AnnotationTEE: "snp", AnnotationDigest: "aa", AnnotationVerified: "t1"}); b != nil {
		t.Fatalf("no change patched: %s", b)
	}
	if b, _ := MergePatch(cur, nil); string(b) != `{"metadata":{"annotations":{"c8s.io/node-cvm.launch-digest":null,"c8s.io/node-cvm.tee":null,"c8s.io/node-cvm.verified-at":null}}}` {
		t.Fatalf("removal: %s", b)
	}
	if _, err := MergePatch(nil, map[string]string{"other": "y"}); err == nil {
		t.Fatal("a foreign annotation was accepted")
	}
}
