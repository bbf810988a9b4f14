package sandbox

import (
	"context"
	"crypto/rand"
	"fmt"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/images/manifest"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/config"
)

// Verified is what a successful attestation of a pod VM established.
type Verified struct {
	// Provider is where the guest got its evidence ("sim", "sev-guest", ...).
	Provider string
	// SNP holds the verified claims of SNP (and sim) evidence.
	SNP *attest.SNPClaims
}

// Attest asks the guest for evidence bound to a fresh nonce and verifies
// it against the launch digests the image manifest expects for this VM's
// shape. The error of a failed check names the field, with the expected
// and actual values.
func (s *Sandbox) Attest(ctx context.Context, cfg config.Config) (*Verified, error) {
	h := cfg.Hypervisor
	m, err := manifest.Load(cfg.ManifestPath())
	if err != nil {
		return nil, fmt.Errorf("attestation needs the image manifest (attestation.manifest): %w", err)
	}
	expected, err := attest.ExpectedMeasurements(m, h.TEE)
	if err != nil {
		return nil, err
	}
	vcpus := int(h.DefaultVCPUs)
	if _, ok := expected[vcpus]; !ok {
		return nil, fmt.Errorf("the image manifest has no %s launch digest for %d vCPUs (it has %s): add the shape to the image build or change the pod's vCPUs", h.TEE, vcpus, attest.Shapes(expected))
	}
	trust, err := attest.TrustFor(h.TEE, SimSPDir(cfg))
	if err != nil {
		return nil, err
	}
	v, err := attest.NewVerifier(trust)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	ev, err := s.Agent.GetEvidence(ctx, &agent.GetEvidenceRequest{ReportData: nonce})
	if err != nil {
		return nil, fmt.Errorf("get evidence from the guest: %w", err)
	}
	policy := &attest.Policy{Measurements: expected, VCPUs: vcpus, Nonce: nonce}
	if d := initdata.Digest(s.initData); d != ([32]byte{}) {
		policy.HostData = d[:]
	}
	switch ev.Kind {
	case "snp":
		claims, err := v.VerifySNP(ev.Report, ev.CertTable, policy)
		if err != nil {
			return nil, err
		}
		if err := s.handInitData(ctx); err != nil {
			return nil, err
		}
		return &Verified{Provider: ev.Provider, SNP: claims}, nil
	default:
		return nil, fmt.Errorf("the guest returned %q evidence from %q, which this node (tee %s) cannot verify", ev.Kind, ev.Provider, h.TEE)
	}
}

// handInitData gives the agent the pod's init data once the VM's HOST_DATA
// has verified; the agent checks it against its own evidence again and
// enforces its policy.
func (s *Sandbox) handInitData(ctx context.Context) error {
	if len(s.initData) == 0 {
		return nil
	}
	if _, err := s.Agent.SetInitData(ctx, &agent.SetInitDataRequest{InitData: s.initData}); err != nil {
		return fmt.Errorf("the agent refused the pod's init data: %w", err)
	}
	return nil
}
