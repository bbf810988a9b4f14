package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/containerd/errdefs"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
)

func evidenceService(resp *agentapi.GetEvidenceResponse) *Service {
	return &Service{cfg: Config{Evidence: func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) { return resp, nil }}}
}

// The broker gets tdx evidence as Trustee's TDX verifier reads it, and
// snp evidence only from a well-formed report.
func TestKBSEvidenceEncodings(t *testing.T) {
	quote := []byte("a TD quote")
	tee, b, err := evidenceService(&agentapi.GetEvidenceResponse{Kind: "tdx", Report: quote}).kbsEvidence(context.Background(), [64]byte{})
	if err != nil || tee != kbsapi.TeeTDX {
		t.Fatalf("tdx: %q, %v", tee, err)
	}
	var tdx map[string]any
	if err := json.Unmarshal(b, &tdx); err != nil || len(tdx) != 2 || tdx["cc_eventlog"] != nil || tdx["quote"] != base64.StdEncoding.EncodeToString(quote) {
		t.Fatalf("tdx evidence %s: want {cc_eventlog: null, quote: base64}", b)
	}
	// An all-zero "report" is no SNP report: refused, not sent.
	if _, _, err := evidenceService(&agentapi.GetEvidenceResponse{Kind: "snp", Report: make([]byte, 1184)}).kbsEvidence(context.Background(), [64]byte{}); err == nil {
		t.Fatal("a report of version 0 was encoded")
	}
	if _, _, err := evidenceService(&agentapi.GetEvidenceResponse{Kind: "cca"}).kbsEvidence(context.Background(), [64]byte{}); !errdefs.IsNotImplemented(err) {
		t.Fatalf("cca evidence: %v, want not implemented", err)
	}
}
