package attest

import (
	"errors"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// Decide refuses, as verdicts, what it cannot judge: no root of trust,
// evidence of a kind no verifier reads, a manifest it cannot read. None
// of them verifies.
func TestDecideRefusesWhatItCannotJudge(t *testing.T) {
	sim := []verdict.Trust{{Mode: ModeSim, SimCertChain: []byte("x")}}
	for name, tc := range map[string]struct {
		req  verdict.Request
		want string
	}{
		"no trust":     {verdict.Request{Evidence: verdict.Evidence{Kind: "snp"}, TEE: "sim"}, "names no root of trust"},
		"unknown kind": {verdict.Request{Evidence: verdict.Evidence{Kind: "sgx", Provider: "p"}, TEE: "sim", Trusts: sim}, `"sgx" evidence from "p"`},
		"no manifest":  {verdict.Request{Evidence: verdict.Evidence{Kind: "snp"}, TEE: "sim", Manifest: "/nonexistent/manifest.json", Trusts: sim}, "attestation.manifest"},
	} {
		v := Decide(&tc.req)
		if v.SNP != nil || v.TDX != nil || v.Err() == nil || !strings.Contains(v.Err().Error(), tc.want) {
			t.Errorf("%s: verdict %+v (%v), want a refusal naming %q", name, v, v.Err(), tc.want)
		}
	}
	var e *Error
	_, _, err := (&Verifier{trust: Trust{Mode: ModeSim}}).VerifyEvidence(verdict.Evidence{Kind: "sgx"}, &Policy{})
	if !errors.As(err, &e) || e.Kind != KindFormat {
		t.Errorf("VerifyEvidence of an unknown kind: %v", err)
	}
}
