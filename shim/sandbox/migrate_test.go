package sandbox

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// waitAgent answers WaitProcess with status, after block is closed.
type waitAgent struct {
	agent.AgentService
	status uint32
	block  chan struct{}
	calls  atomic.Int32
}

func (w *waitAgent) WaitProcess(ctx context.Context, _ *agent.ProcessRequest) (*agent.WaitProcessResponse, error) {
	w.calls.Add(1)
	if w.block != nil {
		select {
		case <-w.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &agent.WaitProcessResponse{ExitStatus: w.status}, nil
}

// serveAgent serves svc over ttrpc and returns a connection to it.
func serveAgent(t *testing.T, svc agent.AgentService) *agentConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	agent.RegisterAgentService(srv, svc)
	go srv.Serve(context.Background(), l)
	t.Cleanup(func() { srv.Close() })
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c := newAgentConn(conn)
	t.Cleanup(func() { c.client.Close() })
	return c
}

// A call the cut-over interrupts (the source's connection closes under
// it) is retried on the destination's connection; without a migration the
// error stands.
func TestAgentCallsFollowTheMigration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := &waitAgent{block: make(chan struct{})}
	dst := &waitAgent{status: 7}
	s := &Sandbox{cur: serveAgent(t, src)}
	s.Agent = movingAgent{s}
	moving := make(chan struct{})
	s.moving = moving

	type result struct {
		r   *agent.WaitProcessResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := s.Agent.WaitProcess(ctx, &agent.ProcessRequest{ContainerId: "c1"})
		done <- result{r, err}
	}()
	for src.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	// The cut-over: the destination's connection becomes current, the
	// source's closes, then the migration ends.
	s.mu.Lock()
	old := s.cur
	s.cur = serveAgent(t, dst)
	s.epoch++
	s.mu.Unlock()
	old.client.Close()
	s.mu.Lock()
	s.moving = nil
	s.mu.Unlock()
	close(moving)

	res := <-done
	if res.err != nil || res.r.ExitStatus != 7 || dst.calls.Load() != 1 {
		t.Fatalf("WaitProcess across the cut-over = %v, %v (destination calls %d); want status 7 from the destination", res.r, res.err, dst.calls.Load())
	}

	// No migration: a closed connection's error reaches the caller.
	stuck := &waitAgent{block: make(chan struct{})}
	s.cur = serveAgent(t, stuck)
	go func() {
		_, err := s.Agent.WaitProcess(ctx, &agent.ProcessRequest{ContainerId: "c1"})
		done <- result{nil, err}
	}()
	for stuck.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	s.cur.client.Close()
	if res := <-done; !errors.Is(res.err, ttrpc.ErrClosed) {
		t.Fatalf("WaitProcess on a closed connection without a migration = %v, want ttrpc.ErrClosed", res.err)
	}
}

// After a migration the pod's evidence must come from the destination's
// chip and chain to a root of the trust pool.
func TestAttestAfterMigrationTrustsThePoolAndPinsTheChip(t *testing.T) {
	good := strings.Repeat("11", 48)
	cfg, _ := setup(t, map[string]string{"1": good})
	ctx := context.Background()
	poolNode, err := sim.New(sim.DefaultTCB)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := sim.New(sim.DefaultTCB)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(statedir.PoolRoots(cfg.Runtime.StateDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(statedir.PoolRoots(cfg.Runtime.StateDir), "b.pem"), poolNode.CertChainPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	chip := poolNode.ChipID()
	moved := func(sp *sim.SP, pin []byte) *Sandbox {
		return &Sandbox{Agent: &fakeGuest{evidence: simReport(t, sp, good, [32]byte{})}, movedChip: pin}
	}
	v, err := moved(poolNode, chip[:]).Attest(ctx, cfg)
	if err != nil || string(v.SNP.ChipID) != string(chip[:]) {
		t.Fatalf("evidence from the pool node's chip: %v, %v", v, err)
	}
	if _, err := moved(stranger, chip[:]).Attest(ctx, cfg); err == nil || !strings.Contains(err.Error(), "does not verify against any of the 2 trusted roots") {
		t.Fatalf("evidence from a node outside the pool: %v", err)
	}
	other := stranger.ChipID()
	if _, err := moved(poolNode, other[:]).Attest(ctx, cfg); err == nil || !strings.Contains(err.Error(), "CHIP_ID") {
		t.Fatalf("evidence from another chip than the destination's: %v", err)
	}
	// Before any migration only the node's own root counts.
	if _, err := moved(poolNode, nil).Attest(ctx, cfg); err == nil || !strings.Contains(err.Error(), "certificate chain") {
		t.Fatalf("pool evidence for a pod that never moved: %v", err)
	}
}
