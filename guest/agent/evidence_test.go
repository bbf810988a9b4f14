package agent

import (
	"context"
	"testing"

	"github.com/containerd/errdefs"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

func TestGetEvidence(t *testing.T) {
	ctx := context.Background()
	none := &Service{}
	if _, err := none.GetEvidence(ctx, &agentapi.GetEvidenceRequest{ReportData: []byte("n")}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("guest without a provider: %v, want failed precondition", err)
	}
	var got [64]byte
	svc := &Service{cfg: Config{Evidence: func(_ context.Context, rd [64]byte) (*agentapi.GetEvidenceResponse, error) {
		got = rd
		return &agentapi.GetEvidenceResponse{Kind: "snp", Provider: "sim", Report: []byte("report")}, nil
	}}}
	if _, err := svc.GetEvidence(ctx, &agentapi.GetEvidenceRequest{ReportData: make([]byte, 65)}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("65 bytes of report data: %v, want invalid argument", err)
	}
	resp, err := svc.GetEvidence(ctx, &agentapi.GetEvidenceRequest{ReportData: []byte("nonce")})
	if err != nil || resp.Provider != "sim" || string(resp.Report) != "report" {
		t.Fatalf("GetEvidence = %+v, %v", resp, err)
	}
	if string(got[:5]) != "nonce" || got[5] != 0 {
		t.Fatalf("provider got report data %q, want the nonce zero-padded", got[:8])
	}
}
