package sandbox

import (
	"context"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// warmOn is a warm channel already dialled to svc.
func warmOn(t *testing.T, svc agent.AgentService) *warmAgent {
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
	t.Cleanup(func() { conn.Close() })
	w := &warmAgent{done: make(chan struct{}), conn: conn}
	close(w.done)
	return w
}

// brokenChannel fails GetEvidence as a channel that does not answer.
type brokenChannel struct{ agent.AgentService }

func (brokenChannel) GetEvidence(context.Context, *agent.GetEvidenceRequest) (*agent.GetEvidenceResponse, error) {
	return nil, errors.New("connection reset")
}

// Re-attestation on the channel dialled during the transfer verifies the
// evidence exactly as a fresh channel would: evidence from outside the
// trust pool or from another chip than the destination's is refused on
// it, without trying another channel; only a channel that does not
// answer makes the shim dial again.
func TestReattestOnTheWarmChannel(t *testing.T) {
	good := strings.Repeat("11", 48)
	cfg, _ := setup(t, map[string]string{"1": good})
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
	trusts, err := poolTrust(cfg)
	if err != nil {
		t.Fatal(err)
	}
	chip := poolNode.ChipID()
	in := migrate.IncomingResponse{ID: "pod1", Node: migrate.NodeInfo{Name: "node-b", ChipID: hex.EncodeToString(chip[:])}}
	// Nothing listens behind dst: dialling the channel again fails.
	dst := migrate.NewClient(filepath.Join(t.TempDir(), "gone.sock"))
	s := &Sandbox{ID: "pod1"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	r, err := s.reattest(ctx, cfg, dst, in, warmOn(t, &fakeGuest{evidence: simReport(t, poolNode, good, [32]byte{})}), trusts)
	if err != nil || !r.warm || r.verified.SNP == nil || string(r.verified.SNP.ChipID) != string(chip[:]) {
		t.Fatalf("evidence of the destination's chip on the warm channel: %+v, %v", r, err)
	}
	r.conn.client.Close()

	for name, sp := range map[string]*sim.SP{"a node outside the pool": stranger} {
		_, err := s.reattest(ctx, cfg, dst, in, warmOn(t, &fakeGuest{evidence: simReport(t, sp, good, [32]byte{})}), trusts)
		if err == nil || !strings.Contains(err.Error(), "does not verify against any of the 2 trusted roots") {
			t.Fatalf("evidence from %s on the warm channel: %v; want it refused", name, err)
		}
	}
	other := stranger.ChipID()
	elsewhere := in
	elsewhere.Node.ChipID = hex.EncodeToString(other[:])
	if _, err := s.reattest(ctx, cfg, dst, elsewhere, warmOn(t, &fakeGuest{evidence: simReport(t, poolNode, good, [32]byte{})}), trusts); err == nil || !strings.Contains(err.Error(), "CHIP_ID") {
		t.Fatalf("evidence from another chip than the destination's on the warm channel: %v", err)
	}
	if _, err := s.reattest(ctx, cfg, dst, in, warmOn(t, &fakeGuest{evidence: simReport(t, poolNode, strings.Repeat("22", 48), [32]byte{})}), trusts); err == nil || !strings.Contains(err.Error(), "measurement mismatch") {
		t.Fatalf("evidence of another measurement on the warm channel: %v", err)
	}

	// A warm channel that does not answer: the shim dials again (and here
	// finds nothing).
	if _, err := s.reattest(ctx, cfg, dst, in, warmOn(t, brokenChannel{}), trusts); err == nil || !strings.Contains(err.Error(), "gone.sock") {
		t.Fatalf("a warm channel that does not answer: %v; want a new dial through the destination", err)
	}
	// No warm channel at all (its dial failed): the same.
	if _, err := s.reattest(ctx, cfg, dst, in, nil, trusts); err == nil || !strings.Contains(err.Error(), "gone.sock") {
		t.Fatalf("no warm channel: %v; want a dial through the destination", err)
	}
}
