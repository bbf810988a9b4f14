package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	tdxabi "github.com/google/go-tdx-guest/abi"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
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
	var tee string // the kind of this guest's evidence, "snp" or "tdx"
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
	}
	// The pod's secrets come before its policy takes effect: a pod whose
	// broker refuses it does not start.
	if err := s.fetchSecrets(ctx, doc, r.InitData, tee); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.policy = doc.Agent
	s.mu.Unlock()
	log.G(ctx).WithField("allow_exec", doc.Agent.ExecAllowed()).WithField("allow_devices", doc.Agent.AllowDevices).WithField("secrets", len(doc.KBS.Secrets)).Info("measured init data accepted")
	return &agentapi.Empty{}, nil
}

// execAllowed reports whether the pod's policy lets the host exec.
func (s *Service) execAllowed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy.ExecAllowed()
}

// checkLaunchDigest compares the init data's digest with the one the VM
// was launched with, as its evidence carries it: SNP HOST_DATA or TDX
// MRCONFIGID.
func checkLaunchDigest(ev *agentapi.GetEvidenceResponse, data []byte) error {
	var want, got []byte
	var field string
	switch ev.Kind {
	case "snp":
		if len(ev.Report) < snpHostDataOffset+32 {
			return fmt.Errorf("the SNP report is %d bytes, too short to hold HOST_DATA", len(ev.Report))
		}
		d := initdata.Digest(data)
		want, got, field = d[:], ev.Report[snpHostDataOffset:snpHostDataOffset+32], "HOST_DATA"
	case "tdx":
		q, err := tdxabi.QuoteToProto(ev.Report)
		if err != nil {
			return fmt.Errorf("parse the TDX quote: %w", err)
		}
		body, ok := q.(interface{ GetTdQuoteBody() *tdxpb.TDQuoteBody })
		if !ok {
			return fmt.Errorf("TDX quote of type %T: reading MRCONFIGID from it is not supported: %w", q, errdefs.ErrNotImplemented)
		}
		d := initdata.DigestTDX(data)
		want, got, field = d[:], body.GetTdQuoteBody().GetMrConfigId(), "MRCONFIGID"
	default:
		return fmt.Errorf("checking init data against %q evidence is not supported: %w", ev.Kind, errdefs.ErrNotImplemented)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("init data digest %s does not match the %s %s this VM was launched with: %w",
			hex.EncodeToString(want), field, hex.EncodeToString(got), errdefs.ErrPermissionDenied)
	}
	return nil
}
