package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-tdx-guest/testing/testdata"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/guest/attest"
)

func TestGetEvidence(t *testing.T) {
	ctx := context.Background()
	none := &Service{}
	if _, err := none.GetEvidence(ctx, &agentapi.GetEvidenceRequest{Nonce: []byte("n")}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("guest without a provider: %v, want failed precondition", err)
	}
	var got [64]byte
	svc := &Service{cfg: Config{Evidence: func(_ context.Context, rd [64]byte) (*agentapi.GetEvidenceResponse, error) {
		got = rd
		return &agentapi.GetEvidenceResponse{Kind: "snp", Provider: "sim", Report: []byte("report")}, nil
	}}}
	if _, err := svc.GetEvidence(ctx, &agentapi.GetEvidenceRequest{Nonce: make([]byte, 65)}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a 65-byte nonce: %v, want invalid argument", err)
	}
	resp, err := svc.GetEvidence(ctx, &agentapi.GetEvidenceRequest{Nonce: []byte("nonce")})
	if err != nil || resp.Provider != "sim" || string(resp.Report) != "report" {
		t.Fatalf("GetEvidence = %+v, %v", resp, err)
	}
	if got != reportdata.Host([]byte("nonce")) {
		t.Fatalf("provider got report data %x, want the host-attestation binding of the nonce", got)
	}
}

// A malicious host that runs a key broker's handshake itself asks the
// agent for evidence over the broker's binding of the host's own key
// (REPORT_DATA = SHA-384 of the runtime data, zero-padded). The agent must
// never sign those bytes as they are, or the broker would release the
// pod's secrets to the host.
func TestMaliciousHostChoosesReportData(t *testing.T) {
	ctx := context.Background()
	var got [64]byte
	svc := &Service{cfg: Config{Evidence: func(_ context.Context, rd [64]byte) (*agentapi.GetEvidenceResponse, error) {
		got = rd
		return &agentapi.GetEvidenceResponse{Kind: "snp", Provider: "sim", Report: []byte("report")}, nil
	}}}
	chosen, err := kbsapi.ReportData([]byte(`{"nonce":"n","tee-pubkey":{"kty":"EC","crv":"P-256","x":"host","y":"key"}}`), "sha384")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.GetEvidence(ctx, &agentapi.GetEvidenceRequest{Nonce: chosen[:]}); err != nil {
		t.Fatal(err)
	}
	if got == chosen {
		t.Fatal("the agent signed the REPORT_DATA the host chose: a KBS handshake binding")
	}
	if got != reportdata.Host(chosen[:]) {
		t.Fatalf("REPORT_DATA %x, want the host-attestation binding", got)
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
	// The TD's MRCONFIGID comes from the TDREPORT the guest read itself:
	// init data whose SHA-384 differs must be refused.
	doc := []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	other := initdata.DigestTDX([]byte("version = \"0.1\"\n"))
	svc := &Service{cfg: Config{Evidence: tdxEvidence(testdata.RawQuote, other[:])}}
	_, err := svc.SetInitData(context.Background(), &agentapi.SetInitDataRequest{InitData: doc})
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "MRCONFIGID") {
		t.Fatalf("init data against a TD launched with another MRCONFIGID: %v", err)
	}
	want := initdata.DigestTDX(doc)
	svc = &Service{cfg: Config{Evidence: tdxEvidence(testdata.RawQuote, want[:])}}
	if _, err := svc.SetInitData(context.Background(), &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatalf("init data whose digest is the TDREPORT's MRCONFIGID: %v", err)
	}
}

// tdxEvidence is a TDX guest's evidence: the quote as the host's quoting
// service returned it, and the TDREPORT, with mrConfigID, that the guest
// read from the TDX module.
func tdxEvidence(quote, mrConfigID []byte) func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
	return func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
		var report []byte
		if mrConfigID != nil {
			report = make([]byte, attest.TDReportSize)
			copy(report[attest.TDReportMRConfigID:], mrConfigID)
		}
		return &agentapi.GetEvidenceResponse{Kind: "tdx", Provider: "tdx-guest", Report: quote, TdReport: report}, nil
	}
}

// The quote of a TD reaches the guest through the host's quoting service,
// which could hand back one whose MRCONFIGID is zero (edited, or replayed
// from another TD) so that the agent thinks nothing was measured and
// serves the host under the allow-all policy. The agent reads MRCONFIGID
// only from the TDREPORT, and fails closed without one.
func TestMaliciousHostZeroesMRCONFIGIDInTheQuote(t *testing.T) {
	ctx := context.Background()
	doc := []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	measured := initdata.DigestTDX(doc)
	// testdata.RawQuote's MRCONFIGID is zero: what the host would relay.
	svc := &Service{cfg: Config{Evidence: tdxEvidence(testdata.RawQuote, measured[:])}, containers: map[string]*container{}}
	if _, err := svc.CreateContainer(ctx, &agentapi.CreateContainerRequest{ContainerId: "c1", Rootfs: rootfsReq()}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("CreateContainer in a TD launched with init data, whose relayed quote says MRCONFIGID zero: %v, want failed precondition (the TDREPORT says measured)", err)
	}
	noReport := &Service{cfg: Config{Evidence: tdxEvidence(testdata.RawQuote, nil)}, containers: map[string]*container{}}
	if _, err := noReport.CreateContainer(ctx, &agentapi.CreateContainerRequest{ContainerId: "c1", Rootfs: rootfsReq()}); err == nil || !strings.Contains(err.Error(), "TDREPORT") {
		t.Fatalf("CreateContainer with TDX evidence but no TDREPORT: %v, want a refusal naming the TDREPORT", err)
	}
}
