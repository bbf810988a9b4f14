package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/attest"
	"github.com/c8s-dev/c8s/guest/policy"
)

// snpHostDataOffset is where HOST_DATA sits in an SNP ATTESTATION_REPORT
// (AMD SEV-SNP ABI, offset C0h, 32 bytes).
const snpHostDataOffset = 0xC0

// SetInitData accepts the pod's init data once its digest matches the
// HOST_DATA this VM was launched with, as the guest's own evidence reports
// it, and then enforces its agent policy. The host cannot loosen the
// policy without changing the measurement.
func (s *Service) SetInitData(ctx context.Context, r *agentapi.SetInitDataRequest) (*agentapi.Empty, error) {
	doc, err := initdata.Parse(r.InitData)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	var tee string     // the kind of this guest's evidence, "snp" or "tdx"
	zeroLaunch := true // the launch digest is zero (or there is none)
	if s.cfg.Evidence == nil {
		if len(r.InitData) > 0 {
			return nil, fmt.Errorf("init data needs a TEE to check it against, and this guest has none: %w", errdefs.ErrFailedPrecondition)
		}
	} else {
		var nonce [64]byte
		if _, err := rand.Read(nonce[:32]); err != nil {
			return nil, err
		}
		ev, err := s.cfg.Evidence(ctx, nonce)
		if err != nil {
			return nil, fmt.Errorf("read the launch HOST_DATA from this guest's evidence: %w", err)
		}
		if err := checkLaunchDigest(ev, r.InitData); err != nil {
			return nil, err
		}
		tee = ev.Kind
		// What this evidence says of the launch holds from now on, whatever
		// order the host calls in (confidential() reads it).
		digest, _, _ := launchDigest(ev)
		s.mu.Lock()
		s.launchKnown, s.launchProvider = true, ev.Provider
		zeroLaunch = bytes.Equal(digest, make([]byte, len(digest)))
		s.launchMeasured = !zeroLaunch
		s.mu.Unlock()
	}
	// An snp or tdx VM launched without init data keeps its built-in
	// default: the init data whose digest is zero is the empty document,
	// which would otherwise allow everything.
	if s.hardwareTEE() && zeroLaunch {
		if err := s.enforceZeroLaunch(); err != nil {
			return nil, err
		}
		log.G(ctx).WithField("tee", s.cfg.TEE).Warn("empty init data: the built-in policy of a VM launched without init data stays in force")
		return &agentapi.Empty{}, nil
	}
	// The pod's secrets come before its policy takes effect: a pod whose
	// broker refuses it does not start.
	if err := s.fetchSecrets(ctx, doc, r.InitData, tee); err != nil {
		return nil, err
	}
	s.setPullBroker(doc, r.InitData, tee) // pull.go: pull_auth credentials
	// The mesh before the policy: once the policy is in force the host's
	// sandbox may be created, and a sandbox created before the mesh was
	// known would run the pod's meshed ports in plaintext.
	s.setMesh(doc, r.InitData)
	s.mu.Lock()
	// Handed again (a re-attestation hands the same document, the digest
	// check above made sure), the policy in force stays, with what its
	// evaluator holds of the pod: its one sandbox, its emptyDir pod. A
	// fresh evaluator would forget them.
	if !s.policySet {
		s.policy, s.policySet = doc.Agent, true
		s.eval = policy.New(doc.Policy, logDenial)
	}
	s.mu.Unlock()
	if testHookPolicyInForce != nil {
		testHookPolicyInForce(s)
	}
	l := log.G(ctx).WithField("allow_exec", doc.Agent.ExecAllowed()).WithField("allow_devices", doc.Agent.AllowDevices).WithField("secrets", len(doc.KBS.Secrets))
	if doc.Policy != nil {
		l = l.WithField("policy", len(doc.Policy.Containers)).WithField("audit", doc.Policy.Audit)
	}
	l.Info("measured init data accepted")
	return &agentapi.Empty{}, nil
}

// execAllowed reports whether the pod's policy lets the host exec.
func (s *Service) execAllowed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy.ExecAllowed()
}

// requirePolicy fails closed: a VM launched with measured init data (a
// non-zero HOST_DATA or MRCONFIGID in its own evidence) takes no container,
// exec or update until the host has handed it that init data, so that the
// host cannot act under the allow-all policy of a pod without one by
// skipping SetInitData or by calling ahead of it. The launch digest is read
// from the guest's evidence once (or taken from the evidence the host
// asked for first, noteLaunch); a VM without a TEE, or launched without
// init data, has the allow-all policy from the start, except one started
// as snp or tdx, which has policyapi.ZeroLaunchDefault (confidential.go).
func (s *Service) requirePolicy(ctx context.Context, what string) error {
	s.mu.Lock()
	set, known, measured := s.policySet, s.launchKnown, s.launchMeasured
	s.mu.Unlock()
	if set {
		return nil
	}
	if !known {
		provider := ""
		if s.cfg.Evidence == nil {
			measured = false
		} else {
			var nonce [64]byte
			if _, err := rand.Read(nonce[:32]); err != nil {
				return err
			}
			ev, err := s.cfg.Evidence(ctx, nonce)
			switch {
			case errors.Is(err, attest.ErrNoProvider):
				// Not a confidential VM and no sim TEE: nothing was
				// measured at launch, so no init data can be bound.
				measured = false
			case err != nil:
				return fmt.Errorf("%s: read whether this VM was launched with measured init data from its evidence: %w", what, err)
			default:
				digest, _, err := launchDigest(ev)
				if err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				measured = !bytes.Equal(digest, make([]byte, len(digest)))
				provider = ev.Provider
			}
		}
		s.mu.Lock()
		s.launchKnown, s.launchMeasured, s.launchProvider = true, measured, provider
		set = s.policySet
		s.mu.Unlock()
	}
	if measured && !set {
		return fmt.Errorf("%s refused: this pod VM was launched with measured init data and its policy is not in force yet: the host must hand the agent that init data first (SetInitData): %w", what, errdefs.ErrFailedPrecondition)
	}
	if !measured && !set && s.hardwareTEE() {
		// An snp or tdx VM launched without init data: the built-in
		// default, from this first request on (confidential.go).
		return s.enforceZeroLaunch()
	}
	return nil
}

// noteLaunch records what evidence from this guest's own TEE says of the
// launch, as requirePolicy would read it: whether the VM was launched with
// init data (a launch digest that is not zero) and the evidence's
// provider. Whoever asked for the evidence (GetEvidence: the host, with
// its nonce bound in) it comes from the TEE, and the launch digest is the
// same in every report of the VM (launchDigest reads it from what the
// guest read itself, never from a host-relayed quote). Evidence whose
// digest cannot be read records nothing: requirePolicy then reads its
// own, and fails closed.
func (s *Service) noteLaunch(ev *agentapi.GetEvidenceResponse) {
	digest, _, err := launchDigest(ev)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.launchKnown {
		return
	}
	s.launchKnown, s.launchProvider = true, ev.Provider
	s.launchMeasured = !bytes.Equal(digest, make([]byte, len(digest)))
}

// confidential reports whether this guest is a confidential VM: started
// as snp or tdx (the measured command line), or with evidence from TEE
// hardware (not the sim TEE, not none) as requirePolicy read it. Either
// alone is enough.
func (s *Service) confidential() bool {
	if s.hardwareTEE() {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.launchProvider != "" && s.launchProvider != attest.NameSim
}

// checkLaunchDigest compares the init data's digest with the one the VM
// was launched with, as its evidence carries it: SNP HOST_DATA or TDX
// MRCONFIGID.
func checkLaunchDigest(ev *agentapi.GetEvidenceResponse, data []byte) error {
	got, field, err := launchDigest(ev)
	if err != nil {
		return err
	}
	var want []byte
	if ev.Kind == "tdx" {
		d := initdata.DigestTDX(data)
		want = d[:]
	} else {
		d := initdata.Digest(data)
		want = d[:]
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("init data digest %s does not match the %s %s this VM was launched with: %w",
			hex.EncodeToString(want), field, hex.EncodeToString(got), errdefs.ErrPermissionDenied)
	}
	return nil
}

// launchDigest returns the init data digest the VM was launched with, as
// its evidence carries it, and the field's name: SNP HOST_DATA or TDX
// MRCONFIGID.
func launchDigest(ev *agentapi.GetEvidenceResponse) ([]byte, string, error) {
	switch ev.Kind {
	case "snp":
		if len(ev.Report) < snpHostDataOffset+32 {
			return nil, "", fmt.Errorf("the SNP report is %d bytes, too short to hold HOST_DATA", len(ev.Report))
		}
		return ev.Report[snpHostDataOffset : snpHostDataOffset+32], "HOST_DATA", nil
	case "tdx":
		// Never from the quote: the host's quoting service returns it, and
		// could hand back one with a zero MRCONFIGID to make the agent
		// think nothing was measured. The TDREPORT comes from the TDX
		// module through guest-private memory.
		if len(ev.TdReport) != attest.TDReportSize {
			return nil, "", fmt.Errorf("TDX evidence without the TDREPORT the guest read itself (%d bytes, want %d): MRCONFIGID cannot be read from the host-relayed quote", len(ev.TdReport), attest.TDReportSize)
		}
		return ev.TdReport[attest.TDReportMRConfigID : attest.TDReportMRConfigID+48], "MRCONFIGID", nil
	default:
		return nil, "", fmt.Errorf("reading the launch digest of %q evidence is not supported: %w", ev.Kind, errdefs.ErrNotImplemented)
	}
}

// testHookPolicyInForce, when set, runs once SetInitData has put the
// policy in force, where a host's concurrent CreateContainer may already
// pass requirePolicy.
var testHookPolicyInForce func(*Service)
