package task

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	adminapi "github.com/c8s-dev/c8s/launcher/api/admin/v1"
)

// admin serves the shim's management API (shim/api/admin) at the ttrpc
// edge.
type admin struct{ s *service }

var _ adminapi.AdminService = admin{}

// Attest re-attests the running pod VM with a fresh nonce.
func (a admin) Attest(ctx context.Context, _ *adminapi.AttestRequest) (*adminapi.AttestResponse, error) {
	resp, err := a.s.attest(ctx)
	return resp, errgrpc.ToGRPC(err)
}

func (s *service) attest(ctx context.Context) (*adminapi.AttestResponse, error) {
	sb, pod, err := s.runningPod()
	if err != nil {
		return nil, err
	}
	v, err := sb.Attest(ctx, pod.cfg)
	if err != nil {
		return nil, fmt.Errorf("attestation of pod VM %s failed: %w: %w", pod.id, err, errdefs.ErrFailedPrecondition)
	}
	claims, err := json.Marshal(v.Claims())
	if err != nil {
		return nil, err
	}
	return &adminapi.AttestResponse{Sandbox: pod.id, Provider: v.Provider, ClaimsJson: claims}, nil
}
