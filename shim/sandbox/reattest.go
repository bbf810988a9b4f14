package sandbox

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"time"

	"github.com/containerd/log"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/migrate"
)

// Re-attestation after a migration (issue 18: < 100 ms). The agent
// channel through the destination is dialled while QEMU transfers the VM
// (warmAgent), so that the destination's virtio-serial port has its host
// when the guest resumes there: the guest sees no disconnection, and the
// first request on the new connection starts a new one in the guest
// (guest/channel: its stream id does not increase). That first request
// is GetEvidence with a fresh nonce, which answers the channel check and
// brings the evidence in one round trip; the evidence is verified exactly
// as before (verifyGuest), by a verifier process started during the
// transfer too. Should the warm channel not answer, the channel is
// dialled again after the move, as it was before.
//
// What remains under TCG (sim) is the guest's first answer on the
// destination: a new QEMU starts with an empty translation cache, and
// perf on the destination QEMU shows 77-83% of its vCPU thread in TCG's
// translator (tb_gen_code) while the guest answers; the same request
// right after costs 4-25 ms. KVM-based SNP and TDX guests run their code
// natively and have no such cost. The cold code is the agent channel's
// request path itself (virtio-serial, the guest kernel, the Go runtime,
// the channel and ttrpc), not the evidence: a GetInfo sent first takes
// as long as the GetEvidence does (147 vs 15 ms for the GetEvidence
// after it, loaded), and so does a first request sent 500 ms after the
// VM resumed there (89 ms, loaded; about 11,000 translation blocks by
// then), so neither another first request nor waiting would help.

// warmAnswerTimeout bounds the first answer on the warm channel before
// the channel is dialled again.
const warmAnswerTimeout = 5 * time.Second

// warmAgent is what the re-attestation needs, readied during the
// transfer: the destination VM's agent channel, and a started evidence
// verifier (c8s-verify), so that neither its start nor its runtime's
// initialisation lands on the re-attestation's critical path, where it
// would also compete with the destination's vCPU for the host's CPUs.
type warmAgent struct {
	done     chan struct{}
	conn     net.Conn
	err      error
	verifier verifier // nil: started at verification, as without a migration
	// startedAt is when verifier started: its verdict.Timeout runs from
	// then, and a long transfer may leave too little of it.
	startedAt time.Time
	taken     bool
}

// verifierFreshFor is how long after its start a verifier readied during
// the transfer is still used; past it, verification starts its own (the
// helper's verdict.Timeout would end it mid-verification otherwise).
const verifierFreshFor = verdict.Timeout / 2

// dialWarm dials the agent channel of the VM id behind dst and starts the
// evidence verifier, in the background.
func dialWarm(ctx context.Context, dst *migrate.Client, id string) *warmAgent {
	return readyWarm(ctx, func(ctx context.Context) (net.Conn, error) { return dst.DialAgent(ctx, id) },
		func(ctx context.Context) (verifier, error) { return startVerifier(ctx) })
}

// readyWarm is dialWarm with its dial and verifier start as functions.
// The channel is dialled first: the destination's port should have its
// host before the VM resumes there.
func readyWarm(ctx context.Context, dial func(context.Context) (net.Conn, error), start func(context.Context) (verifier, error)) *warmAgent {
	w := &warmAgent{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.conn, w.err = dial(ctx)
		if w.err != nil {
			return
		}
		v, err := start(ctx)
		if err != nil {
			// verifyGuest starts it again and reports the failure.
			log.G(ctx).WithError(err).Debug("starting the evidence verifier during the transfer")
			return
		}
		w.verifier, w.startedAt = v, time.Now()
	}()
	return w
}

// take waits for the dial and hands its connection and verifier over
// (nil when the dial failed or ctx ended first).
func (w *warmAgent) take(ctx context.Context) (net.Conn, verifier) {
	if w == nil {
		return nil, nil
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		return nil, nil
	}
	if w.err != nil {
		log.G(ctx).WithError(w.err).Debug("the agent channel dialled during the transfer failed")
		return nil, nil
	}
	w.taken = true
	if w.verifier != nil && time.Since(w.startedAt) > verifierFreshFor {
		w.verifier.Close()
		w.verifier = nil
	}
	return w.conn, w.verifier
}

// close closes a connection and ends a verifier nobody took, once the
// dial has ended.
func (w *warmAgent) close() {
	if w == nil {
		return
	}
	go func() {
		<-w.done
		if w.taken {
			return
		}
		if w.conn != nil {
			w.conn.Close()
		}
		if w.verifier != nil {
			w.verifier.Close()
		}
	}()
}

// firstCall records whether the agent's answer to GetEvidence failed: the
// channel did not work, as opposed to evidence that does not verify.
type firstCall struct {
	agent.AgentService
	err  error
	took time.Duration
}

func (f *firstCall) GetEvidence(ctx context.Context, r *agent.GetEvidenceRequest) (*agent.GetEvidenceResponse, error) {
	t0 := time.Now()
	resp, err := f.AgentService.GetEvidence(ctx, r)
	f.err, f.took = err, time.Since(t0)
	return resp, err
}

// reattested is a re-attestation on the destination.
type reattested struct {
	conn     *agentConn
	verified *Verified
	// connect is the time until the agent channel answered (the warm
	// channel's first answer is its evidence: connect is then the wait
	// for its dial), verify the rest; answer is the part of verify the
	// warm channel's first answer (the evidence) took.
	connect, verify, answer time.Duration
	warm                    bool
}

// reattest opens the agent channel of the VM now running behind dst
// (warm's, else dialled anew) and verifies fresh evidence from it against
// trusts with the destination's chip pinned. On error nothing is left
// open.
func (s *Sandbox) reattest(ctx context.Context, cfg config.Config, dst *migrate.Client, in migrate.IncomingResponse, warm *warmAgent, trusts []verdict.Trust) (*reattested, error) {
	t0 := time.Now()
	var chip []byte
	if in.Node.ChipID != "" {
		var err error
		if chip, err = hex.DecodeString(in.Node.ChipID); err != nil {
			return nil, fmt.Errorf("the destination's chip id %q: %w", in.Node.ChipID, err)
		}
	}
	off := cfg.Attestation.Mode == config.AttestOff
	if off {
		log.G(ctx).WithField("sandbox", s.ID).Warn("attestation is off (attestation.mode): the pod VM is not re-attested on the destination")
	}
	if conn, helper := warm.take(ctx); conn != nil {
		r := &reattested{conn: newAgentConn(conn), connect: time.Since(t0), warm: true}
		wctx, cancel := context.WithTimeout(ctx, warmAnswerTimeout)
		var (
			err       error
			channelOK bool
		)
		switch {
		case off:
			if helper != nil {
				helper.Close()
			}
			_, err = r.conn.agent.GetInfo(wctx, &agent.GetInfoRequest{})
			channelOK, r.verified = err == nil, &Verified{Provider: "none"}
		case helper != nil:
			first := &firstCall{AgentService: r.conn.agent}
			r.verified, err = verifyWith(wctx, helper, cfg, first, s.initData, trusts, chip)
			channelOK, r.answer = first.err == nil, first.took
		default:
			first := &firstCall{AgentService: r.conn.agent}
			r.verified, err = verifyGuest(wctx, cfg, first, s.initData, trusts, chip)
			channelOK, r.answer = first.err == nil, first.took
		}
		cancel()
		r.verify = time.Since(t0) - r.connect
		if channelOK {
			if err != nil {
				r.conn.client.Close()
				return nil, err
			}
			return r, nil
		}
		r.conn.client.Close()
		log.G(ctx).WithError(err).WithField("sandbox", s.ID).Warn("the agent channel dialled during the transfer did not answer; dialling it again")
		t0 = time.Now()
	}
	remote := migrate.NewRemote(dst, in, nil)
	c, _, err := dialAgent(ctx, remote, DefaultAgentTimeout)
	remote.Close()
	if err != nil {
		return nil, err
	}
	r := &reattested{conn: c, connect: time.Since(t0)}
	if off {
		r.verified = &Verified{Provider: "none"}
		return r, nil
	}
	if r.verified, err = verifyGuest(ctx, cfg, c.agent, s.initData, trusts, chip); err != nil {
		c.client.Close()
		return nil, err
	}
	r.verify = time.Since(t0) - r.connect
	return r, nil
}
