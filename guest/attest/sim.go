package attest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/ttrpc"

	attestapi "github.com/c8s-dev/c8s/guest/api/attest/v1"
	"github.com/c8s-dev/c8s/guest/channel"
)

// SimPortName is the virtio-serial port on which the host serves the sim
// TEE's secure processor (attestapi.SimSP).
const SimPortName = "c8s.attest"

// simTimeout bounds a GetReport whose context has no deadline: a host that
// does not serve the port would otherwise leave the caller waiting for
// good.
const simTimeout = 30 * time.Second

// Sim gets SNP evidence from the sim TEE's simulated secure processor,
// over its own virtio-serial port, never over the agent connection.
//
// It keeps one ttrpc client on the port for its lifetime: the port is one
// byte stream, and a second client restarts ttrpc's stream ids on a
// connection the host's server already numbered. It dials again only after
// the host disconnected, or after a context ended a request mid-write;
// the host's server must then take the stream-id reset as a new client
// (as guest/channel's SerialListener does on the agent port).
type Sim struct {
	path string
	dial func(path string) (net.Conn, error)

	mu     sync.Mutex
	conn   net.Conn
	client *ttrpc.Client
}

// NewSim returns the provider for the port device at path.
func NewSim(path string) *Sim {
	return &Sim{path: path, dial: channel.DialPort}
}

// Name is NameSim.
func (*Sim) Name() string { return NameSim }

// Evidence asks the simulated secure processor for a report with
// reportData (VMPL 0).
func (s *Sim) Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, simTimeout)
		defer cancel()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	req := &attestapi.GetReportRequest{ReportData: reportData[:], Vmpl: 0}
	var resp *attestapi.GetReportResponse
	for attempt := 0; ; attempt++ {
		if err := s.connect(); err != nil {
			return nil, err
		}
		// ttrpc writes a request without watching ctx, and a port with
		// no host behind it takes no data: the context ends the write.
		conn := s.conn
		stop := context.AfterFunc(ctx, func() { _ = conn.SetWriteDeadline(time.Now()) })
		var err error
		resp, err = attestapi.NewSimSPClient(s.client).GetReport(ctx, req)
		if !stop() {
			// The connection may hold half a request: start afresh.
			s.closeLocked()
		}
		if err == nil {
			break
		}
		if errors.Is(err, ttrpc.ErrClosed) {
			// The host went away; a new connection starts afresh.
			s.closeLocked()
			if attempt == 0 {
				continue
			}
			return nil, fmt.Errorf("sim: the host closed the port %s: %w (does the launcher serve the %s port?)", s.path, err, SimPortName)
		}
		if cerr := ctx.Err(); cerr != nil {
			if !errors.Is(err, cerr) {
				err = fmt.Errorf("%w (%v)", cerr, err)
			}
			return nil, fmt.Errorf("sim: no report from the simulated secure processor on %s: %w; does the launcher serve the %s port?", s.path, err, SimPortName)
		}
		return nil, fmt.Errorf("sim: GetReport on %s: %w", s.path, err)
	}
	if err := checkSNPReport(resp.GetReport(), reportData); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return &Evidence{Kind: KindSNP, Provider: NameSim, Report: resp.GetReport(), CertTable: resp.GetCertTable(),
		EventLog: resp.GetEventLog(), SimRTMRs: resp.GetRtmrStatement()}, nil
}

func (s *Sim) connect() error {
	if s.client != nil {
		return nil
	}
	conn, err := s.dial(s.path)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	s.conn, s.client = conn, ttrpc.NewClient(conn)
	return nil
}

func (s *Sim) closeLocked() {
	if s.client != nil {
		_ = s.client.Close()
		s.conn, s.client = nil, nil
	}
}

// Close closes the connection to the port, if open.
func (s *Sim) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked()
	return nil
}
