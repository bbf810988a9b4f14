package sandbox

import (
	"context"
	"encoding/hex"
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
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
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

	// With the verifier started during the transfer: the same verdicts,
	// from that verifier.
	for name, c := range map[string]struct {
		sp     *sim.SP
		refuse string
	}{"the destination's chip": {poolNode, ""}, "a node outside the pool": {stranger, "does not verify against any of the 2 trusted roots"}} {
		w := warmOn(t, &fakeGuest{evidence: simReport(t, c.sp, good, [32]byte{})})
		helper, err := startVerifier(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v := &recordingVerifier{verifier: helper}
		w.verifier, w.startedAt = v, time.Now()
		r, err := s.reattest(ctx, cfg, dst, in, w, trusts)
		if c.refuse == "" && (err != nil || r.verified.SNP == nil || string(r.verified.SNP.ChipID) != string(chip[:])) {
			t.Fatalf("evidence of %s, verifier started during the transfer: %+v, %v", name, r, err)
		}
		if c.refuse != "" && (err == nil || !strings.Contains(err.Error(), c.refuse)) {
			t.Fatalf("evidence of %s, verifier started during the transfer: %v; want it refused", name, err)
		}
		if !v.decided.Load() {
			t.Fatalf("evidence of %s: the verifier started during the transfer was not used", name)
		}
		if r != nil {
			r.conn.client.Close()
		}
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

// recordingVerifier records that Decide was called.
type recordingVerifier struct {
	verifier
	decided, closed atomic.Bool
}

func (v *recordingVerifier) Decide(r *verdict.Request) (*verdict.Verdict, error) {
	v.decided.Store(true)
	return v.verifier.Decide(r)
}

func (v *recordingVerifier) Close() {
	v.closed.Store(true)
	if v.verifier != nil {
		v.verifier.Close()
	}
}

// The transfer readies the re-attestation: the agent channel is dialled
// first (the destination's port has its host before the VM resumes
// there), then the verifier starts; what nobody takes is closed, and a
// failed dial starts no verifier.
func TestReadyWarmDialsThenStartsTheVerifier(t *testing.T) {
	ctx := context.Background()
	var order []string
	client, server := net.Pipe()
	defer server.Close()
	v := &recordingVerifier{}
	w := readyWarm(ctx,
		func(context.Context) (net.Conn, error) { order = append(order, "dial"); return client, nil },
		func(context.Context) (verifier, error) { order = append(order, "verifier"); return v, nil })
	conn, got := w.take(ctx)
	if conn != client || got != v || strings.Join(order, ",") != "dial,verifier" {
		t.Fatalf("take = %v, %v after %v; want the dialled channel and the verifier, dialled first", conn, got, order)
	}
	w.close()
	time.Sleep(20 * time.Millisecond)
	if v.closed.Load() {
		t.Fatal("close ended the verifier re-attestation took")
	}

	// Not taken (the migration failed): both closed.
	client2, server2 := net.Pipe()
	v2 := &recordingVerifier{}
	w = readyWarm(ctx,
		func(context.Context) (net.Conn, error) { return client2, nil },
		func(context.Context) (verifier, error) { return v2, nil })
	w.close()
	server2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := server2.Read(make([]byte, 1)); err == nil {
		t.Fatal("the channel nobody took is still open")
	}
	for deadline := time.Now().Add(5 * time.Second); !v2.closed.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the verifier nobody took was not ended")
		}
	}

	// A verifier started too long ago (a long transfer): ended, and not
	// handed over; verification starts its own.
	client3, server3 := net.Pipe()
	defer server3.Close()
	v3 := &recordingVerifier{}
	w = readyWarm(ctx,
		func(context.Context) (net.Conn, error) { return client3, nil },
		func(context.Context) (verifier, error) { return v3, nil })
	<-w.done
	w.startedAt = time.Now().Add(-verifierFreshFor - time.Second)
	if conn, got := w.take(ctx); conn != client3 || got != nil || !v3.closed.Load() {
		t.Fatalf("with a verifier started %s ago: take = %v, %v (closed %v); want the channel only, the verifier ended", verifierFreshFor, conn, got, v3.closed.Load())
	}
	client3.Close()

	// A failed dial: no verifier, nothing to take.
	started := false
	w = readyWarm(ctx,
		func(context.Context) (net.Conn, error) { return nil, errors.New("refused") },
		func(context.Context) (verifier, error) { started = true; return &recordingVerifier{}, nil })
	if conn, got := w.take(ctx); conn != nil || got != nil || started {
		t.Fatalf("after a failed dial: take = %v, %v, verifier started %v", conn, got, started)
	}
}
