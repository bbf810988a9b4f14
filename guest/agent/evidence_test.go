package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-tdx-guest/testing/testdata"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
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

func TestSetInitDataChecksHostDataAndEnforcesExec(t *testing.T) {
	ctx := context.Background()
	doc := []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	digest := initdata.Digest(doc)
	report := func(hostData [32]byte) func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
		return func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
			r := make([]byte, 1184)
			copy(r[snpHostDataOffset:], hostData[:])
			return &agentapi.GetEvidenceResponse{Kind: "snp", Provider: "sim", Report: r}, nil
		}
	}
	// Launched with other init data: refused, policy unchanged.
	svc := &Service{cfg: Config{Evidence: report([32]byte{1})}}
	if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: doc}); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("init data whose digest is not the launch HOST_DATA: %v, want permission denied", err)
	}
	if !svc.execAllowed() {
		t.Fatal("a refused policy took effect")
	}
	// Launched with it: accepted, exec refused.
	svc = &Service{cfg: Config{Evidence: report(digest)}, containers: map[string]*container{}}
	if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatal(err)
	}
	if svc.execAllowed() {
		t.Fatal("allow_exec = false not enforced")
	}
	svc.containers["c1"] = &container{id: "c1"}
	_, err := svc.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "c1", ExecId: "e1", Process: []byte(`{"args":["sh"]}`)})
	if !errdefs.IsPermissionDenied(err) {
		t.Fatalf("exec under allow_exec = false: %v, want permission denied", err)
	}
	// Malformed init data is refused before anything else.
	if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: []byte("[agent_policy\n")}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("malformed init data: %v", err)
	}
	// No TEE: only empty init data is acceptable.
	none := &Service{}
	if _, err := none.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: doc}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("init data without a TEE: %v", err)
	}
	if _, err := none.SetInitData(ctx, &agentapi.SetInitDataRequest{}); err != nil {
		t.Fatalf("empty init data without a TEE: %v", err)
	}
}

func TestSetInitDataAgainstATDXQuote(t *testing.T) {
	// The sample quote's MRCONFIGID is whatever its TD was launched with;
	// init data whose SHA-384 differs must be refused.
	quote := testdata.RawQuote
	svc := &Service{cfg: Config{Evidence: func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
		return &agentapi.GetEvidenceResponse{Kind: "tdx", Provider: "tdx-guest", Report: quote}, nil
	}}}
	doc := []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	_, err := svc.SetInitData(context.Background(), &agentapi.SetInitDataRequest{InitData: doc})
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "MRCONFIGID") {
		t.Fatalf("init data against a TD launched with another MRCONFIGID: %v", err)
	}
}
