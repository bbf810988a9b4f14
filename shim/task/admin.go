package task

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containerd/errdefs"

	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

// admin serves the shim's management API (shim/api/admin). Its errors
// become gRPC status at the ttrpc edge, as the task API's (edge.go).
type admin struct{ s *service }

var _ adminapi.AdminService = admin{}

// Attest re-attests the running pod VM with a fresh nonce.
func (a admin) Attest(ctx context.Context, _ *adminapi.AttestRequest) (*adminapi.AttestResponse, error) {
	return a.s.attest(ctx)
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
