package sandbox

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/containerd/log"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/manifest"
)

// Verified is what a successful attestation of a pod VM established.
type Verified struct {
	// Provider is where the guest got its evidence ("sim", "sev-guest", ...).
	Provider string
	// SNP holds the verified claims of SNP (and sim) evidence.
	SNP *attest.SNPClaims
	// TDX holds the verified claims of a TDX quote.
	TDX *attest.TDXClaims
}

// Claims returns the verified claims, whichever TEE they came from.
func (v *Verified) Claims() any {
	if v.TDX != nil {
		return v.TDX
	}
	return v.SNP
}

// Attest asks the guest for evidence bound to a fresh nonce and verifies
// it against what the image manifest expects for this VM: the launch
// digest of its shape (SNP, sim) or its MRTD (TDX), and the digest of the
// pod's init data. The error of a failed check names the field, with the
// expected and actual values. Once the evidence verifies, the agent gets
// the init data.
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

// nodeTrust returns the node's own trust: the roots of its TEE and, with
// attestation.collateral_dir, the offline collateral in it (Intel's for
// tdx, AMD's CRLs for snp; the sim TEE has none).
func nodeTrust(cfg config.Config) (attest.Trust, error) {
	t, err := attest.TrustFor(cfg.Hypervisor.TEE, statedir.SimSP(cfg.Runtime.StateDir))
	if err != nil {
		return t, err
	}
	if dir := cfg.Attestation.CollateralDir; dir != "" && t.Mode != attest.ModeSim {
		if err := t.LoadCollateral(dir); err != nil {
			return t, fmt.Errorf("attestation.collateral_dir: %w", err)
		}
	}
	return t, nil
}

// verifyGuest gets evidence bound to a fresh nonce from the agent ag and
// verifies it against the manifest's expectations for the pod and any of
// trusts; chipID, when set, pins the SNP chip.
func verifyGuest(ctx context.Context, cfg config.Config, ag agent.AgentService, initData []byte, trusts []attest.Trust, chipID []byte) (*Verified, error) {
	h := cfg.Hypervisor
	m, err := manifest.Load(cfg.ManifestPath())
	if err != nil {
		return nil, fmt.Errorf("attestation needs the image manifest (attestation.manifest): %w", err)
	}
	policy, err := expectedPolicy(m, h.TEE, int(h.DefaultVCPUs), initData)
	if err != nil {
		return nil, err
	}
	policy.MinTCB, policy.AllowDebug, policy.ChipID = cfg.Attestation.MinTCB, cfg.Attestation.AllowDebug, chipID
	nonce, err := attest.NewNonce()
	if err != nil {
		return nil, err
	}
	// The agent binds the nonce in the host-attestation domain, never as
	// it is (guest/api/reportdata).
	rd := reportdata.Host(nonce)
	policy.Nonce = rd[:]
	ev, err := ag.GetEvidence(ctx, &agent.GetEvidenceRequest{Nonce: nonce})
	if err != nil {
		return nil, fmt.Errorf("get evidence from the guest: %w", err)
	}
	var errs []error
	for _, trust := range trusts {
		v, err := attest.NewVerifier(trust)
		if err != nil {
			return nil, err
		}
		verified := &Verified{Provider: ev.Provider}
		switch ev.Kind {
		case "snp":
			if trust.Mode == attest.ModeSim {
				// The sim TEE's modelled RTMRs and boot log first.
				verified.SNP, err = v.VerifySimEvidence(ev.Report, ev.CertTable, ev.SimRtmrs, ev.EventLog, policy)
			} else {
				verified.SNP, err = v.VerifySNP(ev.Report, ev.CertTable, policy)
			}
		case "tdx":
			verified.TDX, err = v.VerifyTDXEvidence(ev.Report, ev.EventLog, policy)
		default:
			return nil, fmt.Errorf("the guest returned %q evidence from %q, which this node (tee %s) cannot verify", ev.Kind, ev.Provider, h.TEE)
		}
		if err == nil {
			return verified, nil
		}
		var ae *attest.Error
		if len(trusts) == 1 || !errors.As(err, &ae) || (ae.Kind != attest.KindSignature && ae.Kind != attest.KindRoot) {
			// Anything but "not this root" is the answer.
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("the evidence does not verify against any of the %d trusted roots: %w", len(trusts), errors.Join(errs...))
}

// expectedPolicy is what the manifest and the pod's init data say a VM of
// TEE tee with vcpus vCPUs must show (the nonce is added per request): the
// launch digest, the measured boot (attest.PolicyFromManifest) and the
// init data's digest.
func expectedPolicy(m *manifest.Manifest, tee string, vcpus int, initData []byte) (*attest.Policy, error) {
	p, err := attest.PolicyFromManifest(m, tee, vcpus)
	if err != nil || len(initData) == 0 {
		return p, err
	}
	if tee == "tdx" {
		d := initdata.DigestTDX(initData)
		p.MRConfigID = d[:]
	} else {
		d := initdata.Digest(initData)
		p.HostData = d[:]
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
