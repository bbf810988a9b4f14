package sandbox

import (
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-tdx-guest/testing/testdata"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
)

// fakeGuest answers GetEvidence the way a guest in the sim TEE does, with
// reports from the node's simulated secure processor.
type fakeGuest struct {
	agent.AgentService
	evidence func(reportData []byte) *agent.GetEvidenceResponse
	initData []byte
	// rawNonce makes it bind the host's nonce as it is, as c8s agents
	// before the host-attestation domain did.
	rawNonce bool
}

func (g *fakeGuest) GetEvidence(_ context.Context, r *agent.GetEvidenceRequest) (*agent.GetEvidenceResponse, error) {
	if g.rawNonce {
		return g.evidence(r.Nonce), nil
	}
	rd := reportdata.Host(r.Nonce)
	return g.evidence(rd[:]), nil
}

func (g *fakeGuest) SetInitData(_ context.Context, r *agent.SetInitDataRequest) (*agent.Empty, error) {
	g.initData = r.InitData
	return &agent.Empty{}, nil
}

func setup(t *testing.T, digests map[string]string) (config.Config, *sim.SP) {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Runtime.StateDir = dir
	cfg.Attestation.Manifest = filepath.Join(dir, "manifest.json")
	m := manifest.Manifest{
		Schema:      manifest.Schema,
		Kernel:      manifest.Kernel{Package: "linux-image-x", Version: "1", Release: "6.12"},
		Cmdline:     "console=ttyS0",
		AgentSHA256: strings.Repeat("ab", 32),
		Artifacts: map[string]manifest.Artifact{
			manifest.RoleKernel: {File: "vmlinuz", Size: 1, SHA256: strings.Repeat("cd", 32)},
			manifest.RoleInitrd: {File: "initrd.img", Size: 1, SHA256: strings.Repeat("ef", 32)},
		},
	}
	if err := m.SetSim(manifest.SimDigests{ByVCPUs: digests}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetTDX(manifest.TDXDigests{MRTD: strings.Repeat("ab", 48), RTMR1: strings.Repeat("01", 48), RTMR2: strings.Repeat("02", 48),
		Boot: &manifest.BootDigests{Kernel: strings.Repeat("03", 48), LoadOptions: strings.Repeat("04", 48), Initrd: strings.Repeat("05", 48)}}); err != nil {
		t.Fatal(err)
	}
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Attestation.Manifest, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sp, err := sim.Open(statedir.SimSP(cfg.Runtime.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	return cfg, sp
}

func simReport(t *testing.T, sp *sim.SP, measurement string, hostData [32]byte) func([]byte) *agent.GetEvidenceResponse {
	return func(reportData []byte) *agent.GetEvidenceResponse {
		req := sim.Request{HostData: hostData}
		copy(req.Measurement[:], mustHex(t, measurement))
		copy(req.ReportData[:], reportData)
		r, err := sp.Report(req)
		if err != nil {
			t.Fatal(err)
		}
		return &agent.GetEvidenceResponse{Kind: "snp", Provider: "sim", Report: r, CertTable: sp.CertTable()}
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAttestGatesOnTheManifestDigestAndInitData(t *testing.T) {
	good, other := strings.Repeat("11", 48), strings.Repeat("22", 48)
	cfg, sp := setup(t, map[string]string{"1": good, "2": other})
	doc := []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	ctx := context.Background()

	g := &fakeGuest{evidence: simReport(t, sp, good, initdata.Digest(doc))}
	s := &Sandbox{Agent: g, initData: doc}
	v, err := s.Attest(ctx, cfg)
	if err != nil {
		t.Fatalf("a VM launched as the manifest says does not attest: %v", err)
	}
	if v.Provider != "sim" || v.SNP.VCPUs != 1 || string(g.initData) != string(doc) {
		t.Fatalf("verified %+v; init data handed to the agent: %q", v.SNP, g.initData)
	}

	// A node that requires a newer TCB than the chip reports refuses it.
	strict := cfg
	strict.Attestation.MinTCB = ^uint64(0)
	if _, err := (&Sandbox{Agent: &fakeGuest{evidence: simReport(t, sp, good, initdata.Digest(doc))}, initData: doc}).Attest(ctx, strict); err == nil || !strings.Contains(strings.ToLower(err.Error()), "tcb") {
		t.Errorf("attestation.min_tcb above the chip's TCB: %v", err)
	}

	for name, tc := range map[string]struct {
		evidence func([]byte) *agent.GetEvidenceResponse
		vcpus    uint32
		want     string
	}{
		"another shape's digest": {simReport(t, sp, other, initdata.Digest(doc)), 1, "measurement"},
		"other init data":        {simReport(t, sp, good, initdata.Digest([]byte("version = \"0.1\"\n"))), 1, "host"},
		"unlisted shape":         {simReport(t, sp, good, initdata.Digest(doc)), 3, "no sim launch digest for 3 vCPUs"},
	} {
		g := &fakeGuest{evidence: tc.evidence}
		c := cfg
		c.Hypervisor.DefaultVCPUs = tc.vcpus
		_, err := (&Sandbox{Agent: g, initData: doc}).Attest(ctx, c)
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)) {
			t.Errorf("%s: err = %v, want one mentioning %q", name, err, tc.want)
		}
		if g.initData != nil {
			t.Errorf("%s: the agent got the init data of a VM that did not attest", name)
		}
	}

	// REPORT_DATA must be the host-attestation binding of the shim's nonce
	// (guest/api/reportdata): evidence over the bare nonce, which an agent
	// that signs whatever the host asks would give, does not verify.
	raw := &fakeGuest{evidence: simReport(t, sp, good, initdata.Digest(doc)), rawNonce: true}
	if _, err := (&Sandbox{Agent: raw, initData: doc}).Attest(ctx, cfg); err == nil || !strings.Contains(strings.ToLower(err.Error()), "report_data") {
		t.Errorf("evidence binding the bare nonce: err = %v, want a REPORT_DATA mismatch", err)
	}
}

func TestAttestTDXChecksTheQuoteAgainstTheManifest(t *testing.T) {
	cfg, _ := setup(t, map[string]string{"1": strings.Repeat("11", 48)})
	cfg.Hypervisor.TEE = "tdx"
	g := &fakeGuest{evidence: func([]byte) *agent.GetEvidenceResponse {
		return &agent.GetEvidenceResponse{Kind: "tdx", Provider: "tdx-guest", Report: testdata.RawQuote}
	}}
	_, err := (&Sandbox{Agent: g}).Attest(context.Background(), cfg)
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "mrtd") {
		t.Fatalf("a TDX quote whose MRTD is not the manifest's: err = %v, want an MRTD mismatch", err)
	}
	t.Logf("refused: %v", err)
}
