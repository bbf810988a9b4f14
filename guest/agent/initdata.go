package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

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
	want := initdata.Digest(r.InitData)
	if s.cfg.Evidence == nil {
		if want != ([32]byte{}) {
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
		if ev.Kind != "snp" || len(ev.Report) < snpHostDataOffset+32 {
			return nil, fmt.Errorf("checking init data against %q evidence is not supported yet: %w", ev.Kind, errdefs.ErrNotImplemented)
		}
		got := ev.Report[snpHostDataOffset : snpHostDataOffset+32]
		if !bytes.Equal(got, want[:]) {
			return nil, fmt.Errorf("init data digest %s does not match the HOST_DATA %s this VM was launched with: %w",
				hex.EncodeToString(want[:]), hex.EncodeToString(got), errdefs.ErrPermissionDenied)
		}
	}
	s.mu.Lock()
	s.policy = doc.Agent
	s.mu.Unlock()
	log.G(ctx).WithField("allow_exec", doc.Agent.ExecAllowed()).Info("measured init data accepted")
	return &agentapi.Empty{}, nil
}

// execAllowed reports whether the pod's policy lets the host exec.
func (s *Service) execAllowed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy.ExecAllowed()
}
