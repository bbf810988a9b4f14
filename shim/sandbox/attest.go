package sandbox

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/containerd/log"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim/simtrust"
)

// Verified is what a successful attestation of a pod VM established.
type Verified struct {
	// Provider is where the guest got its evidence ("sim", "sev-guest", ...).
	Provider string
	// SNP holds the verified claims of SNP (and sim) evidence.
	SNP *verdict.SNPClaims
	// TDX holds the verified claims of a TDX quote.
	TDX *verdict.TDXClaims
}

// Claims returns the verified claims, whichever TEE they came from.
func (v *Verified) Claims() any {
	if v.TDX != nil {
		return v.TDX
	}
	return v.SNP
}

// Attest asks the guest for evidence bound to a fresh nonce and has it
// verified against what the image manifest expects for this VM: the
// launch digest of its shape (SNP, sim) or its MRTD (TDX), and the digest
// of the pod's init data. The error of a failed check names the field,
// with the expected and actual values. Once the evidence verifies, the
// agent gets the init data.
func (s *Sandbox) Attest(ctx context.Context, cfg config.Config) (*Verified, error) {
	trusts, chip, err := s.trust(cfg)
	if err != nil {
		return nil, err
	}
	verified, err := verifyGuest(ctx, cfg, s.Agent, s.initData, trusts, chip)
	if err != nil {
		return nil, err
	}
	if err := s.HandInitData(ctx); err != nil {
		return nil, err
	}
	return verified, nil
}

// nodeTrust returns the node's own root of trust: its TEE vendor's, or
// the node's simulated secure processor's (its ASK and ARK). The offline
// collateral of attestation.collateral_dir is the verifier's to load (the
// request's CollateralDir).
func nodeTrust(cfg config.Config) (verdict.Trust, error) {
	switch tee := cfg.Hypervisor.TEE; tee {
	case "sim":
		b, err := os.ReadFile(filepath.Join(statedir.SimSP(cfg.Runtime.StateDir), simtrust.CertChainFile))
		if err != nil {
			return verdict.Trust{}, fmt.Errorf("attestation: the node's simulated root: %w", err)
		}
		return verdict.Trust{Mode: verdict.ModeSim, SimCertChain: b}, nil
	case "snp":
		return verdict.Trust{Mode: verdict.ModeSNP}, nil
	case "tdx":
		return verdict.Trust{Mode: verdict.ModeTDX}, nil
	default:
		return verdict.Trust{}, fmt.Errorf("attestation: no verifier for TEE %q (hypervisor.tee is sim, snp or tdx)", tee)
	}
}

// verifyGuest gets evidence bound to a fresh nonce from the agent ag and
// has c8s-verify verify it against the manifest's expectations for the
// pod and any of trusts; chipID, when set, pins the SNP chip. The
// verification runs in that short-lived process, never in the shim
// (issue 18: its verifiers would stay resident for the pod's life); its
// refusal comes back as the *verdict.Error (= *attest.Error) it was, with
// the same text.
func verifyGuest(ctx context.Context, cfg config.Config, ag agent.AgentService, initData []byte, trusts []verdict.Trust, chipID []byte) (*Verified, error) {
	// The verifier process starts while the guest makes its evidence.
	helper, err := startVerifier(ctx)
	if err != nil {
		return nil, err
	}
	return verifyWith(ctx, helper, cfg, ag, initData, trusts, chipID)
}

// verifier is a started c8s-verify (*verdict.Helper): Decide once, or
// Close.
type verifier interface {
	Decide(*verdict.Request) (*verdict.Verdict, error)
	Close()
}

// verifyWith is verifyGuest with its verifier already started (a
// migration starts it during the transfer, reattest.go); it ends helper.
func verifyWith(ctx context.Context, helper verifier, cfg config.Config, ag agent.AgentService, initData []byte, trusts []verdict.Trust, chipID []byte) (*Verified, error) {
	h := cfg.Hypervisor
	nonce, err := verdict.NewNonce()
	if err != nil {
		helper.Close()
		return nil, err
	}
	ev, err := ag.GetEvidence(ctx, &agent.GetEvidenceRequest{Nonce: nonce})
	if err != nil {
		helper.Close()
		return nil, fmt.Errorf("get evidence from the guest: %w", err)
	}
	// The agent binds the nonce in the host-attestation domain, never as
	// it is (guest/api/reportdata).
	rd := reportdata.Host(nonce)
	req := &verdict.Request{
		Evidence: verdict.Evidence{
			Kind: ev.Kind, Provider: ev.Provider, Report: ev.Report, CertTable: ev.CertTable,
			SimRTMRs: ev.SimRtmrs, EventLog: ev.EventLog,
		},
		TEE: h.TEE, Manifest: cfg.ManifestPath(), VCPUs: int(h.DefaultVCPUs),
		ReportData: rd[:], MinTCB: cfg.Attestation.MinTCB, AllowDebug: cfg.Attestation.AllowDebug, ChipID: chipID,
		Trusts: trusts, CollateralDir: cfg.Attestation.CollateralDir,
	}
	if len(initData) != 0 {
		if h.TEE == "tdx" {
			d := initdata.DigestTDX(initData)
			req.MRConfigID = d[:]
		} else {
			d := initdata.Digest(initData)
			req.HostData = d[:]
		}
	}
	v, err := helper.Decide(req)
	if err != nil {
		return nil, err
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	return &Verified{Provider: ev.Provider, SNP: v.SNP, TDX: v.TDX}, nil
}

// Verifier is the path of c8s-verify, the evidence verifier ("": next
// to the running binary, the shim, else on PATH). Tests set it.
var Verifier string

// verifierName is the binary Verifier names: launcher/cmd/c8s-verify.
const verifierName = "c8s-verify"

// startVerifier starts `c8s-verify verify-evidence`.
func startVerifier(ctx context.Context) (*verdict.Helper, error) {
	p, err := verifierPath()
	if err != nil {
		return nil, err
	}
	return verdict.Start(ctx, p)
}

func verifierPath() (string, error) {
	if Verifier != "" {
		return Verifier, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), verifierName)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath(verifierName)
	if err != nil {
		return "", fmt.Errorf("attestation runs %s, which is neither next to the shim nor on PATH (install it with the shim: make build; c8s-launcher install): %w", verifierName, err)
	}
	return p, nil
}

// HandInitData gives the agent the pod's init data, once the VM's
// HOST_DATA has verified unless attestation is off; the agent checks it
// against its own evidence again and enforces its policy. A VM launched
// with init data takes no container before.
func (s *Sandbox) HandInitData(ctx context.Context) error {
	if len(s.initData) == 0 {
		return nil
	}
	if _, err := s.Agent.SetInitData(ctx, &agent.SetInitDataRequest{InitData: s.initData}); err != nil {
		return fmt.Errorf("the agent refused the pod's init data: %w", err)
	}
	// What the operator (and an e2e test) can match against the owner's
	// c8s-measure output: the digests the VM was launched with, and
	// whether the agent now enforces a [policy].
	pol := "none"
	if doc, err := initdata.Parse(s.initData); err == nil && doc.Policy != nil {
		pol = "enforced"
		if doc.Policy.Audit {
			pol = "audit"
		}
	}
	hd, mc := initdata.Digest(s.initData), initdata.DigestTDX(s.initData)
	log.G(ctx).WithFields(log.Fields{
		"sandbox": s.ID, "host_data": hex.EncodeToString(hd[:]), "mrconfigid": hex.EncodeToString(mc[:]), "policy": pol,
	}).Info("measured init data accepted")
	return nil
}
