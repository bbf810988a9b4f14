package migrate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/vm"
)

// Defaults of Options.
const (
	DefaultTimeout      = 10 * time.Minute
	DefaultPollInterval = 25 * time.Millisecond
	// DefaultMaxBandwidth lifts QEMU's 128 MiB/s default: pod VMs are small
	// and the network between pool nodes is fast.
	DefaultMaxBandwidth = 8 << 30
	// rollbackTimeout bounds the rollback, which runs even after ctx ended.
	rollbackTimeout = time.Minute
)

// Capabilities are the migration capabilities the source sets.
var Capabilities = map[string]bool{
	// events: MIGRATION state events, for logs.
	"events": true,
	// pause-before-switchover would stop at pre-switchover; the guest is
	// re-attested after the switch-over instead, with rollback by cont.
}

// Source is the pod VM to move.
type Source struct {
	VM *vm.VM
	// Node is the source node's NodeInfo (LocalNode).
	Node NodeInfo
	// HostData is the VM's HOST_DATA (the digest of its init data).
	HostData []byte
	// MinTCB is the pod's minimum TCB.
	MinTCB uint64
	// Layers are the VM's disks that are image layers of the node's
	// layer cache (layers.go), and Namespace the pod's containerd
	// namespace.
	Layers    []Layer
	Namespace string
}

// Options tune Run.
type Options struct {
	// Timeout bounds the transfer (DefaultTimeout when zero); on expiry the
	// migration is cancelled and rolled back.
	Timeout time.Duration
	// PollInterval is how often query-migrate is polled.
	PollInterval time.Duration
	// Parameters are set before migrating; a zero MaxBandwidth means
	// DefaultMaxBandwidth.
	Parameters vm.MigrationParameters
	// Progress, when set, is called with each query-migrate answer.
	Progress func(vm.MigrationInfo)
	// Ready, when set, is called once the destination listens, before the
	// transfer starts; it must not block (the shim dials the destination
	// VM's agent channel meanwhile, so that Reattest finds it open).
	Ready func(ctx context.Context, in IncomingResponse)
	// Reattest verifies the VM on the destination after the transfer (the
	// caller dials in.AgentSocket). An error rolls the migration back.
	Reattest func(ctx context.Context, in IncomingResponse) error
	// QEMUCapabilities are the source QEMU's migration capability names,
	// for CheckTEESupport (Run queries them when nil).
	QEMUCapabilities []string

	// rewriteURI lets tests put a proxy between source and destination.
	rewriteURI func(string) string
	// plainStream makes the source send a plain stream whatever the
	// destination expects; streamIdentity replaces the Client's identity
	// for the stream (tests: a source without TLS, another pool member).
	plainStream    bool
	streamIdentity string
}

// Result is a successful migration.
type Result struct {
	Incoming IncomingResponse
	// Info is the source's final query-migrate (TotalTime, Downtime).
	Info vm.MigrationInfo
	// Total is preflight to re-attested, as c8s measures it.
	Total time.Duration
	// Reattest is the re-attestation's share of Total.
	Reattest time.Duration
	// The trace, from Run's start: the source's preflight done, the
	// destination listening (its QEMU started, concurrently with the
	// preflight), the migration started, and QEMU's completion seen.
	Preflight, Listening, Started, Transferred time.Duration
}

// Run migrates src to the destination behind dst; see the package
// documentation. On success the source QEMU is paused in postmigrate and
// the caller must stop it; on failure it runs again and the destination
// VM is gone.
//
// The destination starts its QEMU while the source runs its preflight
// (the destination runs its own before starting anything): a preflight
// that fails destroys the destination VM again.
func Run(ctx context.Context, src Source, dst *Client, opts Options) (*Result, error) {
	t0 := time.Now()
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.Parameters.MaxBandwidth == 0 {
		opts.Parameters.MaxBandwidth = DefaultMaxBandwidth
	}
	q := src.VM.QMP()
	if err := checkSourceState(ctx, q); err != nil {
		return nil, err
	}
	caps := opts.QEMUCapabilities
	if caps == nil {
		var err error
		if caps, err = queryCapabilities(ctx, q); err != nil {
			return nil, err
		}
	}
	if err := CheckTEESupport(src.Node.TEE, q.Version(), caps); err != nil {
		return nil, err
	}
	spec, err := src.VM.MigrationSpec()
	if err != nil {
		return nil, err
	}
	shape := Shape{VCPUs: spec.Hypervisor.DefaultVCPUs, MemoryMiB: spec.Hypervisor.DefaultMemoryMiB}
	type incoming struct {
		in  IncomingResponse
		err error
		at  time.Duration
	}
	// The source's stream credentials load while the destination starts
	// its QEMU; prepareStream then points the stream at them, or removes
	// them when the destination offers a plain stream.
	credsLoaded := preloadSourceCreds(ctx, q, src.VM.StateDir(), dst, opts)
	inc := make(chan incoming, 1)
	go func() {
		in, err := dst.Incoming(ctx, IncomingRequest{
			ID: spec.ID, Source: src.Node, Shape: shape, MinTCB: src.MinTCB,
			KernelParams: spec.Hypervisor.KernelParams, Accel: spec.Accel,
			Disks: spec.Disks, Layers: src.Layers, Namespace: src.Namespace, VsockCID: spec.VsockCID, HostData: src.HostData,
		})
		inc <- incoming{in, err, time.Since(t0)}
	}()
	dnode, perr := sourcePreflight(ctx, q, src, dst, shape, opts)
	tPreflight := time.Since(t0)
	got := <-inc
	in, tIncoming := got.in, got.at
	loaded := credsLoaded()
	if loaded && (perr != nil || got.err != nil) {
		resetStreamTLS(context.WithoutCancel(ctx), q)
	}
	if perr != nil {
		if got.err == nil {
			if err := dst.Delete(context.WithoutCancel(ctx), spec.ID); err != nil {
				log.G(ctx).WithError(err).WithField("vm", spec.ID).Warn("destroying the destination VM after a failed preflight")
			}
		}
		return nil, perr
	}
	if got.err != nil {
		// The destination may have started the VM and lost only its
		// answer: it is destroyed all the same, unless the destination
		// refused because it already runs that VM (another attempt's).
		if errors.Is(got.err, ErrConflict) {
			return nil, fmt.Errorf("migration of %s to node %s: %w", spec.ID, dnode.Name, got.err)
		}
		if err := dst.Delete(context.WithoutCancel(ctx), spec.ID); err != nil && !errors.Is(err, ErrNotFound) {
			log.G(ctx).WithError(err).WithField("vm", spec.ID).Warn("destroying the destination VM after a failed Incoming")
		}
		return nil, fmt.Errorf("migration of %s to node %s: %w", spec.ID, dnode.Name, got.err)
	}
	r := &rollback{src: q, dst: dst, id: spec.ID, node: dnode.Name}
	if opts.Ready != nil {
		opts.Ready(ctx, in)
	}
	if err := prepareStream(ctx, q, src.VM.StateDir(), dst, in, dnode.Name, opts, loaded); err != nil {
		return nil, r.do(ctx, err)
	}
	tStart := time.Since(t0)
	info, err := transfer(ctx, q, in, opts)
	if err != nil {
		return nil, r.do(ctx, err)
	}
	tTransferred := time.Since(t0)
	res := &Result{Incoming: in, Info: info, Preflight: tPreflight, Listening: tIncoming, Started: tStart, Transferred: tTransferred}
	if opts.Reattest != nil {
		t1 := time.Now()
		if err := opts.Reattest(ctx, in); err != nil {
			return nil, r.do(ctx, fmt.Errorf("re-attestation on node %s failed: %w", dnode.Name, err))
		}
		res.Reattest = time.Since(t1)
	}
	res.Total = time.Since(t0)
	log.G(ctx).WithFields(log.Fields{
		"vm": spec.ID, "to": dnode.Name, "qemu_total_ms": res.Info.TotalTime, "downtime_ms": res.Info.Downtime,
		"preflight": tPreflight.Round(time.Millisecond), "incoming": tIncoming.Round(time.Millisecond),
		"migrate_at": tStart.Round(time.Millisecond), "completed_at": tTransferred.Round(time.Millisecond), "tls": in.TLS && !opts.plainStream,
		"reattest": res.Reattest.Round(time.Millisecond), "total": res.Total.Round(time.Millisecond),
	}).Info("migration transferred and re-attested on the destination")
	return res, nil
}

// sourcePreflight is the source's side of the preflight once the
// destination is asked to listen: the destination passes Preflight, and
// the migration's capabilities and parameters are set.
func sourcePreflight(ctx context.Context, q *vm.QMP, src Source, dst *Client, shape Shape, opts Options) (NodeInfo, error) {
	dnode, err := dst.Node(ctx)
	if err != nil {
		return NodeInfo{}, err
	}
	if err := Preflight(src.Node, dnode, shape, src.MinTCB); err != nil {
		return dnode, err
	}
	if err := q.SetMigrationCapabilities(ctx, Capabilities); err != nil {
		return dnode, err
	}
	return dnode, q.SetMigrationParameters(ctx, opts.Parameters)
}

// prepareStream sets the source QEMU up for the stream the destination
// expects: TLS with the source node's identity (already loaded when
// loaded, see preloadSourceCreds), or plain TCP only where
// checkPlainStream allows it.
func prepareStream(ctx context.Context, q executor, stateDir string, dst *Client, in IncomingResponse, node string, opts Options, loaded bool) error {
	if opts.plainStream {
		return nil
	}
	if !in.TLS {
		if loaded {
			resetStreamTLS(ctx, q)
		}
		return checkPlainStream(in.URI, node, dst.plainLoopback)
	}
	identity := sourceIdentity(dst, opts)
	if identity == "" {
		return fmt.Errorf("node %s expects the migration stream under TLS, and no migration TLS identity is configured for the source (migrate.Dial sets the node's)", node)
	}
	if ok, err := HasTLSIdentity(identity); err != nil {
		return fmt.Errorf("the node's migration TLS identity: %w", err)
	} else if !ok {
		return fmt.Errorf("node %s expects the migration stream under TLS, and this node has no migration TLS identity in %s (%s, %s, %s signed by the trust pool's CA)", node, identity, TLSCertFile, TLSKeyFile, TLSCAFile)
	}
	host, err := uriHost(in.URI)
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	if loaded {
		return useSourceCreds(ctx, q, host)
	}
	return setupStreamTLS(ctx, q, stateDir, identity, endpointClient, host, "")
}

// sourceIdentity is the migration TLS identity the source presents.
func sourceIdentity(dst *Client, opts Options) string {
	if opts.streamIdentity != "" {
		return opts.streamIdentity
	}
	return dst.streamIdentity
}

// preloadSourceCreds has the source QEMU load the node's stream
// credentials in the background (loadSourceCreds), where the stream may
// use them; the function it returns waits and says whether they are
// loaded. Nothing is loaded for a plain stream or without an identity
// (prepareStream names the problem if the destination wants TLS); a load
// that fails is left to prepareStream's setupStreamTLS, which reports it.
func preloadSourceCreds(ctx context.Context, q executor, stateDir string, dst *Client, opts Options) func() bool {
	identity := sourceIdentity(dst, opts)
	if opts.plainStream || identity == "" {
		return func() bool { return false }
	}
	if ok, err := HasTLSIdentity(identity); err != nil || !ok {
		return func() bool { return false }
	}
	done := make(chan bool, 1)
	go func() {
		err := loadSourceCreds(ctx, q, stateDir, identity)
		if err != nil {
			log.G(ctx).WithError(err).Debug("migrate: loading the stream credentials ahead")
			// A failed or cancelled load may have left its object in
			// QEMU (added, its reply lost): leave the node's key nowhere.
			resetStreamTLS(context.WithoutCancel(ctx), q)
		}
		done <- err == nil
	}()
	return sync.OnceValue(func() bool { return <-done })
}

func queryCapabilities(ctx context.Context, q *vm.QMP) ([]string, error) {
	var list []struct {
		Capability string `json:"capability"`
	}
	if err := q.Execute(ctx, "query-migrate-capabilities", nil, &list); err != nil {
		return nil, err
	}
	names := make([]string, len(list))
	for i, c := range list {
		names[i] = c.Capability
	}
	return names, nil
}

// transfer runs the migration to in.URI until QEMU reports it completed:
// its MIGRATION event ends the wait at once; query-migrate is polled for
// progress.
func transfer(ctx context.Context, q *vm.QMP, in IncomingResponse, opts Options) (vm.MigrationInfo, error) {
	uri := in.URI
	if opts.rewriteURI != nil {
		uri = opts.rewriteURI(uri)
	}
	tctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	events, unsubscribe := q.Subscribe("MIGRATION")
	defer unsubscribe()
	if err := q.Migrate(tctx, uri); err != nil {
		return vm.MigrationInfo{}, err
	}
	tick := time.NewTicker(opts.PollInterval)
	defer tick.Stop()
	for {
		info, err := q.QueryMigrate(tctx)
		if err == nil {
			if opts.Progress != nil {
				opts.Progress(info)
			}
			switch info.Status {
			case vm.MigrationCompleted:
				// The source is in postmigrate, and the figures final,
				// a moment after "completed".
				return completedInfo(tctx, q, info), nil
			case vm.MigrationFailed:
				return info, fmt.Errorf("QEMU reports the migration failed: %s", orUnknown(info.ErrorDesc))
			case vm.MigrationCancelled:
				return info, errors.New("the migration was cancelled (migrate_cancel)")
			}
		}
		select {
		case <-tick.C:
			continue
		case <-events:
			continue
		case <-tctx.Done():
		}
		if ctx.Err() != nil {
			return info, fmt.Errorf("the migration was cancelled: %w", ctx.Err())
		}
		return info, fmt.Errorf("the migration timed out after %s (status %s, %s remaining)", opts.Timeout, info.Status, remaining(info))
	}
}

// completedInfo returns the final figures once the source has settled:
// QEMU marks a migration completed a moment before it computes total-time
// and downtime, and only then puts the source in postmigrate (which the
// rollback's cont resumes from), so a query in between reads zeros or
// finish-migrate; ask again briefly.
func completedInfo(ctx context.Context, q *vm.QMP, info vm.MigrationInfo) vm.MigrationInfo {
	for i := 0; i < 100; i++ {
		if info.TotalTime != 0 {
			if state, err := q.RunState(ctx); err != nil || state != "finish-migrate" {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		again, err := q.QueryMigrate(ctx)
		if err != nil || again.Status != vm.MigrationCompleted {
			break
		}
		info = again
	}
	return info
}

func orUnknown(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

func remaining(info vm.MigrationInfo) string {
	if info.RAM == nil {
		return "unknown"
	}
	return fmt.Sprintf("%d MiB", info.RAM.Remaining>>20)
}

// rollback undoes a failed migration: no outgoing migration, no
// destination VM, the source running. A source whose migration completed
// (postmigrate) while the destination VM could not be destroyed stays
// paused: the destination holds the whole guest and may run it, and two
// running copies would both hold the pod's secrets and identity.
type rollback struct {
	src  sourceQMP
	dst  vmDeleter
	id   string
	node string
}

// sourceQMP is what a rollback asks of the source's QEMU (*vm.QMP).
type sourceQMP interface {
	executor
	QueryMigrate(ctx context.Context) (vm.MigrationInfo, error)
	MigrateCancel(ctx context.Context) error
	RunState(ctx context.Context) (string, error)
	Cont(ctx context.Context) error
}

// vmDeleter destroys a destination VM (*Client).
type vmDeleter interface {
	Delete(ctx context.Context, id string) error
}

func (r *rollback) do(ctx context.Context, cause error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	q := r.src
	var errs []error
	// 1. End the outgoing migration. One sending its last pages and
	// device state is not cancelled but let finish: the destination may
	// have the whole guest already, and QEMU resumes a source whose
	// migration was cancelled by itself; once completed, step 3 decides.
	status := ""
	if info, err := q.QueryMigrate(ctx); err == nil && !finished(info.Status) {
		if info.Status != migrationStatusDevice {
			if err := q.MigrateCancel(ctx); err != nil {
				errs = append(errs, fmt.Errorf("migrate_cancel: %w", err))
			}
		}
		for !finished(info.Status) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
			if info, err = q.QueryMigrate(ctx); err != nil {
				break
			}
		}
		status = info.Status
	} else if err == nil {
		status = info.Status
	}
	// The stream's credentials (a next attempt adds them again).
	resetStreamTLS(ctx, q)
	// 2. Destroy the destination VM before the source takes its disks back.
	destroyed := true
	if err := r.dst.Delete(ctx, r.id); err != nil && !errors.Is(err, ErrNotFound) {
		errs = append(errs, fmt.Errorf("destroying the destination VM: %w", err))
		destroyed = false
	}
	// 3. Resume the source (cont also from postmigrate), unless the
	// destination may run the guest too.
	state, err := q.RunState(ctx)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("query-status: %w", err))
	case !destroyed && (state == vm.RunStatePostmigrate || state == runStateFinishMigrate || status == vm.MigrationCompleted):
		errs = append(errs, fmt.Errorf("the source stays paused: the destination VM %s on node %s received the whole guest and was not destroyed, so it may run it; "+
			"destroy it there (the node's `c8s-launcher serve` API: DELETE of the VM, or stop its QEMU), then resume the source (QMP cont) or delete the pod", r.id, r.node))
	case state != "running":
		if err := q.Cont(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cont from %s: %w", state, err))
		}
	}
	log.G(ctx).WithError(cause).WithFields(log.Fields{"vm": r.id, "to": r.node, "source_state_was": state}).Warn("migration rolled back")
	if len(errs) > 0 {
		return fmt.Errorf("migration of %s to node %s failed: %w; ROLLBACK INCOMPLETE: %w", r.id, r.node, cause, errors.Join(errs...))
	}
	return fmt.Errorf("migration of %s to node %s failed: %w; rolled back: the VM runs on the source again and the destination VM is destroyed", r.id, r.node, cause)
}

// runStateFinishMigrate is QEMU's run state while it sends a migration's
// last pages: the destination may get the whole guest.
const runStateFinishMigrate = "finish-migrate"

// migrationStatusDevice is query-migrate's status while QEMU sends the
// last pages and device state, the guest paused.
const migrationStatusDevice = "device"

// checkSourceState refuses to migrate a VM that an earlier migration left
// behind (postmigrate, finish-migrate, inmigrate): its guest went, or may
// have gone, to a destination that was not destroyed, and a migration's
// rollback resumes the source, which would run a second copy beside it.
func checkSourceState(ctx context.Context, q sourceQMP) error {
	state, err := q.RunState(ctx)
	if err != nil {
		return fmt.Errorf("query-status: %w", err)
	}
	switch state {
	case vm.RunStatePostmigrate, runStateFinishMigrate, "inmigrate":
		return fmt.Errorf("the VM is in state %s, left by an earlier migration whose destination VM may hold the guest: destroy that VM, then resume this one (QMP cont) or delete the pod", state)
	}
	return nil
}

func finished(status string) bool {
	switch status {
	case "", "none", vm.MigrationCompleted, vm.MigrationFailed, vm.MigrationCancelled:
		return true
	}
	return false
}
