package task

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containerd/errdefs"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
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

// Evidence returns fresh, unverified evidence of the running pod VM bound
// to the caller's nonce, for a verifier outside the shim.
func (a admin) Evidence(ctx context.Context, r *adminapi.EvidenceRequest) (*adminapi.EvidenceResponse, error) {
	return a.s.evidence(ctx, r)
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

// evidence asks the guest for evidence bound to the caller's nonce. The
// guest binds it in the host-attestation domain (guest/api/reportdata),
// so the caller gets nothing it could not get at the pod's start; the
// evidence is passed on as the agent returned it, and the launch
// parameters come from the pod's configuration.
func (s *service) evidence(ctx context.Context, r *adminapi.EvidenceRequest) (*adminapi.EvidenceResponse, error) {
	if n := len(r.Nonce); n == 0 || n > reportdata.MaxNonce {
		return nil, fmt.Errorf("nonce has %d bytes, want 1 to %d: send a fresh random challenge: %w", n, reportdata.MaxNonce, errdefs.ErrInvalidArgument)
	}
	sb, pod, err := s.runningPod()
	if err != nil {
		return nil, err
	}
	ev, err := sb.Agent().GetEvidence(ctx, &agent.GetEvidenceRequest{Nonce: r.Nonce})
	if err != nil {
		return nil, fmt.Errorf("evidence of pod VM %s: the guest gave none: %w: %w", pod.id, err, errdefs.ErrFailedPrecondition)
	}
	h := pod.cfg.Hypervisor
	resp := &adminapi.EvidenceResponse{
		Sandbox:   pod.id,
		Kind:      ev.Kind,
		Provider:  ev.Provider,
		Report:    ev.Report,
		CertTable: ev.CertTable,
		TdReport:  ev.TdReport,
		EventLog:  ev.EventLog,
		SimRtmrs:  ev.SimRtmrs,
		Tee:       h.TEE,
		Vcpus:     h.DefaultVCPUs,
		Manifest:  pod.cfg.ManifestPath(),
	}
	if len(pod.initData) > 0 {
		hd, mc := initdata.Digest(pod.initData), initdata.DigestTDX(pod.initData)
		resp.HostData, resp.Mrconfigid = hd[:], mc[:]
	}
	return resp, nil
}
