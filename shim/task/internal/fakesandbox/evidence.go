package fakesandbox

import (
	"context"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
)

// EvidenceKind and EvidenceProvider are what the fake guest's GetEvidence
// says its evidence is.
const (
	EvidenceKind     = "snp"
	EvidenceProvider = "fake"
)

// GetEvidence returns, as the fake guest's "report", the REPORT_DATA a
// real agent binds for the host's nonce (reportdata.Host), so a test sees
// which nonce reached the guest.
func (a guestAgent) GetEvidence(_ context.Context, r *agent.GetEvidenceRequest) (*agent.GetEvidenceResponse, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("GetEvidence", r); err != nil {
		return nil, err
	}
	rd := reportdata.Host(r.Nonce)
	return &agent.GetEvidenceResponse{Kind: EvidenceKind, Provider: EvidenceProvider, Report: rd[:], CertTable: []byte("certs"),
		EventLog: []byte("event log"), SimRtmrs: []byte("rtmrs")}, nil
}
