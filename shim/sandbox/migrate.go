package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/ttrpc"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// machine is where the pod VM runs: a local QEMU (*vm.VM) or, after a
// migration, a VM the destination node runs (*migrate.Remote).
type machine interface {
	Done() <-chan struct{}
	Err() error
	Pid() int
	Stop(ctx context.Context) error
	DialAgent(ctx context.Context) (net.Conn, error)
	ConsolePath() string
	DiskAddress(id string) (vm.DiskAddress, bool)
	AddDisk(ctx context.Context, d vm.Disk) (vm.DiskAddress, error)
	RemoveDisk(ctx context.Context, id string) error
}

var (
	_ machine = (*vm.VM)(nil)
	_ machine = (*migrate.Remote)(nil)
)

// agentConn is one ttrpc connection to the agent.
type agentConn struct {
	client  *ttrpc.Client
	agent   agent.AgentService
	io      agent.IOService
	forward agent.PortForwardService
}

func newAgentConn(c net.Conn) *agentConn {
	client := ttrpc.NewClient(c)
	return &agentConn{client: client, agent: agent.NewAgentClient(client), io: agent.NewIOClient(client), forward: agent.NewPortForwardClient(client)}
}

func (s *Sandbox) machine() machine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vm
}

// conn returns the current agent connection and its epoch.
func (s *Sandbox) conn() (*agentConn, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.epoch
}

// moved reports, after a call on the connection of epoch failed, whether
// it should be retried: the pod moved to another VM meanwhile. While a
// migration runs it waits for its end.
func (s *Sandbox) moved(ctx context.Context, epoch uint64) bool {
	s.mu.Lock()
	moving := s.moving
	s.mu.Unlock()
	if moving != nil {
		select {
		case <-moving:
		case <-ctx.Done():
			return false
		}
	}
	_, now := s.conn()
	return now != epoch
}

// call runs f on the current connection, again on the new one when a
// migration cut it off.
func call[T any](ctx context.Context, s *Sandbox, f func(*agentConn) (T, error)) (T, error) {
	for {
		c, epoch := s.conn()
		if c == nil {
			var zero T
			return zero, errors.New("no agent connection")
		}
		r, err := f(c)
		if err == nil || !s.moved(ctx, epoch) {
			return r, err
		}
		log.G(ctx).WithError(err).Debug("agent call cut off by the migration, retrying on the destination")
	}
}

// progressState is the last query-migrate of the running migration.
type progressState struct {
	mu     sync.Mutex
	active bool
	info   vm.MigrationInfo
}

// MigrationProgress returns the running migration's last progress report
// and whether one runs.
func (s *Sandbox) MigrationProgress() (vm.MigrationInfo, bool) {
	s.progress.mu.Lock()
	defer s.progress.mu.Unlock()
	return s.progress.info, s.progress.active
}

// MigrateOptions tune Migrate.
type MigrateOptions struct {
	Timeout      time.Duration
	MaxBandwidth uint64
	// Layers are the VM's image layer disks (launcher/migrate Layer),
	// which the destination attaches from its own layer cache, and
	// Namespace the pod's containerd namespace.
	Layers    []migrate.Layer
	Namespace string
}

// Migrated is a successful migration.
type Migrated struct {
	// Node is the destination node's name.
	Node string
	// Verified is the re-attestation on the destination.
	Verified *Verified
	Result   *migrate.Result
	// AgentConnect is the part of Result.Reattest spent opening the agent
	// channel through the destination and getting its first answer (under
	// TCG mostly the guest running cold code on the new QEMU); Verify is
	// the rest: fresh evidence from the VM and its verification.
	AgentConnect, Verify time.Duration
	// WarmChannel says the agent channel dialled during the transfer
	// answered (reattest.go): AgentConnect is then only the wait for its
	// dial, and Verify includes the first answer, FirstAnswer.
	WarmChannel bool
	FirstAnswer time.Duration
}

// Migrate live-migrates the pod VM to the node whose `c8s-launcher serve`
// listens on dst (launcher/migrate), re-attests it there against the trust
// pool's roots with the destination's chip pinned, then moves the agent
// connection to it and stops the local QEMU. On error the pod keeps
// running here.
func (s *Sandbox) Migrate(ctx context.Context, cfg config.Config, dst *migrate.Client, o MigrateOptions) (*Migrated, error) {
	if !s.migMu.TryLock() {
		return nil, errors.New("a migration of this pod is already running")
	}
	defer s.migMu.Unlock()
	src, ok := s.machine().(*vm.VM)
	if !ok {
		return nil, fmt.Errorf("pod VM %s was migrated to another node already; migrating it again is not supported yet", s.ID)
	}
	node, err := migrate.LocalNode(cfg, "")
	if err != nil {
		return nil, err
	}
	trusts, err := poolTrust(cfg)
	if err != nil {
		return nil, err
	}
	hostData := initdata.Digest(s.initData)

	// Agent calls that fail while the pod moves wait for the outcome.
	moving := make(chan struct{})
	s.mu.Lock()
	s.moving = moving
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.moving = nil
		s.mu.Unlock()
		close(moving)
	}()

	s.progress.mu.Lock()
	s.progress.active, s.progress.info = true, vm.MigrationInfo{Status: "setup"}
	s.progress.mu.Unlock()
	defer func() {
		s.progress.mu.Lock()
		s.progress.active = false
		s.progress.mu.Unlock()
	}()

	var (
		newConn        *agentConn
		verified       *Verified
		lastLog        time.Time
		tConn, tVerify time.Duration
		warm           *warmAgent
		warmUsed       bool
		firstAnswer    time.Duration
		// pending is the destination VM the handoff file names.
		pending string
		tlsDir  = statedir.MigrateTLS(cfg.Runtime.StateDir)
	)
	res, err := migrate.Run(ctx, migrate.Source{
		VM: src, Node: node, HostData: hostData[:], MinTCB: cfg.Attestation.MinTCB, Layers: o.Layers, Namespace: o.Namespace,
	}, dst, migrate.Options{
		Timeout:    o.Timeout,
		Parameters: vm.MigrationParameters{MaxBandwidth: o.MaxBandwidth},
		Progress: func(info vm.MigrationInfo) {
			s.progress.mu.Lock()
			s.progress.info = info
			s.progress.mu.Unlock()
			// Logged at most once a second, and the final figures.
			if info.RAM != nil && (time.Since(lastLog) >= time.Second || info.Status != "active") {
				lastLog = time.Now()
				log.G(ctx).WithFields(log.Fields{
					"sandbox": s.ID, "status": info.Status, "transferred": info.RAM.Transferred,
					"remaining": info.RAM.Remaining, "total": info.RAM.Total,
					"dirty_pages_rate": info.RAM.DirtyPagesRate, "mbps": info.RAM.Mbps,
				}).Info("migration progress")
			}
		},
		// The destination runs the VM from here on: `shim delete` after a
		// shim that dies from now on stops it there too (the handoff file,
		// removed again should the migration fail). The agent channel
		// through the destination is dialled while QEMU transfers the VM
		// (reattest.go).
		Ready: func(ctx context.Context, in migrate.IncomingResponse) {
			if err := migrate.WriteHandoff(src.StateDir(), dst, in.ID, tlsDir); err != nil {
				log.G(ctx).WithError(err).Warn("recording where the pod VM moves")
			} else {
				pending = in.ID
			}
			warm = dialWarm(ctx, dst, in.ID)
		},
		Reattest: func(ctx context.Context, in migrate.IncomingResponse) error {
			r, err := s.reattest(ctx, cfg, dst, in, warm, trusts)
			if err != nil {
				return err
			}
			newConn, verified, tConn, tVerify, warmUsed, firstAnswer = r.conn, r.verified, r.connect, r.verify, r.warm, r.answer
			log.G(ctx).WithFields(log.Fields{
				"sandbox": s.ID, "connect": tConn.Round(time.Millisecond), "verify": tVerify.Round(time.Millisecond), "warm_channel": r.warm, "first_answer": r.answer.Round(time.Millisecond),
			}).Info("re-attestation on the destination")
			return nil
		},
	})
	warm.close() // unless re-attestation took it
	if err != nil {
		if pending != "" {
			if cerr := migrate.ClearHandoff(context.WithoutCancel(ctx), src.StateDir(), dst, pending); cerr != nil {
				log.G(ctx).WithError(cerr).Warn("the failed migration's destination VM")
			}
		}
		return nil, err
	}
	remote := migrate.NewRemote(dst, res.Incoming, mustSpecDisks(src))
	s.cutOver(ctx, src, remote, newConn, verified)
	// Stopping the source QEMU removed its state dir, the record with it:
	// `shim delete` after a dead shim finds the moved VM through this.
	if err := migrate.WriteHandoff(src.StateDir(), dst, res.Incoming.ID, tlsDir); err != nil {
		log.G(ctx).WithError(err).Warn("recording where the pod VM moved")
	}
	s.mu.Lock()
	s.handoffDir = src.StateDir()
	s.mu.Unlock()
	log.G(ctx).WithFields(log.Fields{
		"sandbox": s.ID, "to": res.Incoming.Node.Name, "qemu_total_ms": res.Info.TotalTime, "downtime_ms": res.Info.Downtime,
		"total": res.Total.Round(time.Millisecond), "reattest": res.Reattest.Round(time.Millisecond),
	}).Info("pod VM migrated and re-attested on the destination")
	return &Migrated{Node: res.Incoming.Node.Name, Verified: verified, Result: res, AgentConnect: tConn, Verify: tVerify, WarmChannel: warmUsed, FirstAnswer: firstAnswer}, nil
}

// cutOver makes the destination VM and its connection current, then
// tears the source down. Calls the switch cut off are retried on the
// destination.
func (s *Sandbox) cutOver(ctx context.Context, src *vm.VM, remote *migrate.Remote, c *agentConn, v *Verified) {
	s.mu.Lock()
	old, stopHost := s.cur, s.stopHost
	s.vm, s.cur, s.stopHost = remote, c, nil
	if v.SNP != nil {
		s.movedChip = v.SNP.ChipID
	} else {
		s.movedChip = []byte{} // TDX: no chip to pin, the pool's roots still apply
	}
	s.epoch++
	s.mu.Unlock()
	if stopHost != nil {
		stopHost() // the source's sim secure processor and relays
	}
	if old != nil {
		old.client.Close()
	}
	t0 := time.Now()
	if err := src.Stop(context.WithoutCancel(ctx)); err != nil {
		log.G(ctx).WithError(err).Warn("stopping the source QEMU after the migration")
	}
	log.G(ctx).WithField("took", time.Since(t0).Round(time.Millisecond)).Debug("source QEMU stopped")
}

func mustSpecDisks(v *vm.VM) []vm.Disk {
	spec, err := v.MigrationSpec()
	if err != nil {
		return nil
	}
	return spec.Disks
}

// trust returns the roots the pod's evidence must chain to and the chip it
// must come from: the node's own root, or after a migration the pool's
// roots and the destination's chip.
func (s *Sandbox) trust(cfg config.Config) ([]verdict.Trust, []byte, error) {
	s.mu.Lock()
	chip := s.movedChip
	s.mu.Unlock()
	if chip == nil {
		t, err := nodeTrust(cfg)
		return []verdict.Trust{t}, nil, err
	}
	trusts, err := poolTrust(cfg)
	return trusts, chip, err
}

// poolTrust returns the roots a destination's evidence may chain to: the
// node's own and, in sim, those of the trust pool's other nodes
// (statedir.PoolRoots). Hardware TEEs trust their vendor's roots.
func poolTrust(cfg config.Config) ([]verdict.Trust, error) {
	own, err := nodeTrust(cfg)
	if err != nil {
		return nil, err
	}
	trusts := []verdict.Trust{own}
	if own.Mode != verdict.ModeSim {
		return trusts, nil
	}
	files, _ := filepath.Glob(filepath.Join(statedir.PoolRoots(cfg.Runtime.StateDir), "*.pem"))
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("trust pool root: %w", err)
		}
		trusts = append(trusts, verdict.Trust{Mode: verdict.ModeSim, SimCertChain: b})
	}
	// A moved pod runs on another node than this one: its root goes last.
	trusts = append(trusts[1:], trusts[0])
	return trusts, nil
}
