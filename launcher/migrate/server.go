package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// Server is the destination side (`c8s-launcher serve`): it accepts
// incoming pod VMs, runs them, and serves their host-side TEE part (the
// sim TEE's secure processor with this node's identity).
type Server struct {
	// Config is the node's configuration (hypervisor paths, state dir,
	// [node]).
	Config config.Config
	// Name is the node's name ("" for the host name).
	Name string
	// MigrationHost is the address QEMU listens on for incoming migrations
	// (default 127.0.0.1).
	MigrationHost string
	// Layers gives incoming VMs their image layer disks (layers.go); nil
	// means the node's layer cache (runtime.layer_cache_dir) without
	// conversion: layers it lacks are refused.
	Layers LayerStore

	mu  sync.Mutex
	vms map[string]*hostedVM

	// held counts the Serve calls (one per listener) that hold the
	// node's migration server lock (reap.go), released by the last.
	heldMu sync.Mutex
	held   int
	unlock func()
}

// hostedVM is one VM the server started.
type hostedVM struct {
	vm       guest
	stopHost context.CancelFunc
	// owner is the caller whose Incoming created the VM: only it may use
	// or delete the VM.
	owner peer
	// release drops the VM's references on its layer disks, once it is
	// stopped.
	release func(context.Context)
	// resumed is when QEMU resumed the incoming VM (trace.go).
	resumed atomic.Pointer[time.Time]
}

// guest is the VM a hostedVM runs: a *vm.VM (qemuGuest), a fake in tests.
type guest interface {
	Pid() int
	Done() <-chan struct{}
	Err() error
	Stop(ctx context.Context) error
	DialAgent(ctx context.Context) (net.Conn, error)
	RunState(ctx context.Context) (string, error)
}

type qemuGuest struct{ *vm.VM }

func (g qemuGuest) RunState(ctx context.Context) (string, error) { return g.QMP().RunState(ctx) }

// Handler returns the API's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/node", s.handleNode)
	mux.HandleFunc("POST /v1/incoming", s.handleIncoming)
	mux.HandleFunc("GET /v1/vms/{id}", s.handleStatus)
	mux.HandleFunc("GET /v1/vms/{id}/wait", s.handleWait)
	mux.HandleFunc("DELETE /v1/vms/{id}", s.handleDelete)
	mux.HandleFunc("POST /v1/vms/{id}/agent", s.handleAgent)
	mux.HandleFunc("POST /v1/relay", s.handleRelay)
	return mux
}

// Listen creates the API's unix socket (mode 0600) at path, replacing a
// stale one. Its directory is made 0700 first, so that no other user can
// reach the socket in the moment between its creation and its chmod: the
// socket lends the node's migration identity to its callers (the TLS
// relay).
func Listen(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("migrate: %s is in use by another server", path)
	}
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Serve serves the API on l until ctx ends, then stops every VM it runs.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if err := s.hold(ctx); err != nil {
		return err
	}
	defer s.unhold()
	hs := &http.Server{Handler: s.Handler(), BaseContext: func(net.Listener) context.Context { return ctx }}
	warmed := make(chan struct{})
	go func() { s.warmLaunch(ctx); close(warmed) }()
	go func() {
		<-ctx.Done()
		hs.Close()
	}()
	err := hs.Serve(l)
	<-warmed // nothing of the server outlives Serve
	s.Close(context.WithoutCancel(ctx))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops every VM the server runs.
func (s *Server) Close(ctx context.Context) {
	s.mu.Lock()
	vms := s.vms
	s.vms = nil
	s.mu.Unlock()
	for _, h := range vms {
		h.stop(ctx)
	}
}

func (h *hostedVM) stop(ctx context.Context) error {
	h.stopHost()
	err := h.vm.Stop(ctx)
	if h.release != nil {
		h.release(ctx)
	}
	return err
}

func (s *Server) local() (NodeInfo, error) { return LocalNode(s.Config, s.Name) }

func (s *Server) handleNode(w http.ResponseWriter, r *http.Request) {
	n, err := s.local()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, n)
}

func (s *Server) handleIncoming(w http.ResponseWriter, r *http.Request) {
	var req IncomingRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("decoding the incoming request: %w", err))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	resp, code, err := s.incoming(ctx, req, peerOf(r))
	if err != nil {
		log.G(ctx).WithError(err).WithField("vm", req.ID).Warn("incoming migration refused")
		writeError(w, code, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// incoming starts QEMU for req with `-incoming defer` and makes it listen
// for a stream from caller (over TLS, see stream.go).
func (s *Server) incoming(ctx context.Context, req IncomingRequest, caller peer) (_ IncomingResponse, code int, retErr error) {
	t0 := time.Now()
	local, err := s.local()
	if err != nil {
		return IncomingResponse{}, http.StatusInternalServerError, err
	}
	if err := Preflight(req.Source, local, req.Shape, req.MinTCB); err != nil {
		return IncomingResponse{}, http.StatusConflict, err
	}
	host := s.migrationHost()
	s.mu.Lock()
	if s.vms == nil {
		s.vms = map[string]*hostedVM{}
	}
	if _, dup := s.vms[req.ID]; dup {
		s.mu.Unlock()
		return IncomingResponse{}, http.StatusConflict, fmt.Errorf("VM %q already runs on node %s", req.ID, local.Name)
	}
	s.vms[req.ID] = nil // reserved
	s.mu.Unlock()
	defer func() {
		if retErr != nil {
			s.mu.Lock()
			delete(s.vms, req.ID)
			s.mu.Unlock()
		}
	}()
	stateDir := statedir.Incoming(s.Config.Runtime.StateDir, req.ID)
	disks, release, code, err := incomingDisks(ctx, req, s.Config.Migration.SharedStorageRoot, s.layerStore, stateDir)
	if err != nil {
		return IncomingResponse{}, code, err
	}
	released := false
	defer func() {
		if retErr != nil && !released {
			release(context.WithoutCancel(ctx))
		}
	}()
	identity := statedir.MigrateTLS(s.Config.Runtime.StateDir)
	useTLS, err := s.StreamTLS()
	if err != nil {
		return IncomingResponse{}, http.StatusServiceUnavailable, err
	}
	var authz string // the stream's client must be the API's caller
	if useTLS && caller.cert != nil {
		if authz, err = x509DN(caller.cert); err != nil {
			return IncomingResponse{}, http.StatusForbidden, fmt.Errorf("%s: %w", caller, err)
		}
	}

	spec, err := s.incomingSpec(req.ID, stateDir, req.Shape, req.KernelParams, req.Accel)
	if err != nil {
		return IncomingResponse{}, http.StatusInternalServerError, err
	}
	spec.Disks, spec.VsockCID = disks, req.VsockCID
	h := spec.Hypervisor
	// The sim TEE's launch measurement (hashing the guest image) is made
	// while QEMU starts.
	type simResult struct {
		host *sim.Host
		err  error
		took time.Duration
	}
	simc := make(chan simResult, 1)
	if h.TEE == "sim" {
		go func() {
			t := time.Now()
			host, err := s.simHost(spec, req.HostData)
			simc <- simResult{host, err, time.Since(t)}
		}()
	} else {
		simc <- simResult{}
	}
	tQEMU := time.Now()
	v, err := vm.Start(context.WithoutCancel(ctx), spec)
	qemuStart := time.Since(tQEMU)
	sr := <-simc
	if err != nil {
		return IncomingResponse{}, http.StatusInternalServerError, fmt.Errorf("start the destination QEMU: %w", err)
	}
	hostCtx, stopHost := context.WithCancel(context.WithoutCancel(ctx))
	hv := &hostedVM{vm: qemuGuest{v}, stopHost: stopHost, owner: caller, release: release}
	released = true // by hv.stop from here on
	// The layer cache sees the VM's references live while its QEMU runs.
	if err := os.WriteFile(filepath.Join(v.StateDir(), qemuPidFile), []byte(strconv.Itoa(v.Pid())), 0o600); err != nil {
		log.G(ctx).WithError(err).WithField("vm", req.ID).Warn("recording the destination QEMU's pid")
	}
	defer func() {
		if retErr != nil {
			hv.stop(context.WithoutCancel(ctx))
		}
	}()
	if sr.err != nil {
		return IncomingResponse{}, http.StatusInternalServerError, sr.err
	}
	if simHost := sr.host; simHost != nil {
		if err := simHost.Attach(log.WithLogger(hostCtx, log.G(hostCtx).WithField("vm", req.ID)), v); err != nil {
			return IncomingResponse{}, http.StatusInternalServerError, err
		}
	}
	if useTLS {
		if err := setupStreamTLS(ctx, v.QMP(), v.StateDir(), identity, endpointServer, "", authz); err != nil {
			return IncomingResponse{}, http.StatusInternalServerError, err
		}
	} else {
		log.G(ctx).WithFields(log.Fields{"vm": req.ID, "host": host}).Warn("migration stream over plain TCP on loopback (migration.plain_loopback)")
	}
	// QEMU resumes the VM on its own once the state is in (no -S, no
	// cont): its RESUME event is logged for the migration's trace.
	resumed, unsubscribe := v.QMP().Subscribe("RESUME")
	defer func() {
		if retErr != nil {
			unsubscribe()
		}
	}()
	if err := v.QMP().MigrateIncoming(ctx, "tcp:"+net.JoinHostPort(host, "0")); err != nil {
		return IncomingResponse{}, http.StatusInternalServerError, err
	}
	info, err := v.QMP().QueryMigrate(ctx)
	if err != nil {
		return IncomingResponse{}, http.StatusInternalServerError, err
	}
	var uri string
	for _, a := range info.SocketAddress {
		if a.Type == "inet" {
			uri = "tcp:" + net.JoinHostPort(a.Host, a.Port)
			break
		}
	}
	if uri == "" {
		return IncomingResponse{}, http.StatusInternalServerError, fmt.Errorf("the destination QEMU did not report its migration port (query-migrate: %+v)", info.SocketAddress)
	}
	s.mu.Lock()
	s.vms[req.ID] = hv
	s.mu.Unlock()
	go logResume(hostCtx, req.ID, resumed, unsubscribe, v.Done(), hv.resumed.Store)
	go func() {
		<-v.Done()
		if err := v.Err(); err != nil {
			log.G(hostCtx).WithError(err).WithField("vm", req.ID).Error("VM exited")
		}
	}()
	log.G(ctx).WithFields(log.Fields{
		"vm": req.ID, "uri": uri, "pid": v.Pid(), "tls": useTLS, "from": caller.String(),
		"qemu_start": qemuStart.Round(time.Millisecond), "sim_measure": sr.took.Round(time.Millisecond), "took": time.Since(t0).Round(time.Millisecond),
	}).Info("waiting for an incoming migration")
	return IncomingResponse{
		ID: req.ID, URI: uri, TLS: useTLS, Pid: v.Pid(), StateDir: v.StateDir(),
		AgentSocket: filepath.Join(v.StateDir(), vm.AgentSocketName), Node: local,
	}, http.StatusOK, nil
}

// incomingSpec is the Spec of an incoming VM of shape, with the source's
// kernel parameters and accelerator, and no disks yet.
func (s *Server) incomingSpec(id, stateDir string, shape Shape, kernelParams, accel string) (vm.Spec, error) {
	h := s.Config.Hypervisor
	h.DefaultVCPUs, h.DefaultMemoryMiB, h.KernelParams = shape.VCPUs, shape.MemoryMiB, kernelParams
	// The source had no hot-plug room (vm.MigrationSpec): neither may this.
	h.DefaultMaxVCPUs, h.DefaultMaxMemoryMiB = 0, 0
	// A sealed image's verity root disk: the same device and command line
	// as on the source (preflight checked that both run the same image).
	root, err := vm.RootFor(&s.Config)
	if err != nil {
		return vm.Spec{}, err
	}
	// Its QEMU dies with the server: one that starts again knows none of
	// the VMs before it (reapIncoming).
	return vm.Spec{Root: root, ID: id, StateDir: stateDir, Hypervisor: h, Accel: accel, Incoming: true, DieWithParent: true}, nil
}

// warmLaunch measures, in the background of the server's start, the sim
// launch of an incoming VM of the node's default shape and kernel
// parameters: the sim TEE remembers it (launcher/vm/tee/sim, memo.go), so
// that a migration here does not hash the guest image (60-80 ms of CPU)
// while its destination QEMU starts, on the migration's critical path.
// A VM of another launch is measured when it comes.
func (s *Server) warmLaunch(ctx context.Context) {
	h := s.Config.Hypervisor
	if h.TEE != "sim" {
		return
	}
	t0 := time.Now()
	spec, err := s.incomingSpec("warm", statedir.Incoming(s.Config.Runtime.StateDir, "warm"),
		Shape{VCPUs: h.DefaultVCPUs, MemoryMiB: h.DefaultMemoryMiB}, h.KernelParams, h.Accel)
	if err == nil {
		_, err = s.simHost(spec, nil)
	}
	if err != nil {
		log.G(ctx).WithError(err).Debug("migrate: measuring the default sim launch ahead")
		return
	}
	log.G(ctx).WithField("took", time.Since(t0).Round(time.Millisecond)).Debug("migrate: default sim launch measured ahead")
}

// qemuPidFile, in a VM's state dir, holds its QEMU's pid (as the shim
// writes it; launcher/layercache reads it).
const qemuPidFile = "qemu.pid"

// layerStore is s.Layers, or the node's layer cache without conversion.
func (s *Server) layerStore() (LayerStore, error) {
	if s.Layers != nil {
		return s.Layers, nil
	}
	c, err := layercache.Open(s.Config.LayerCachePath())
	if err != nil {
		return nil, err
	}
	return &CacheLayers{Cache: c, Dir: c.Dir()}, nil
}

func (s *Server) migrationHost() string {
	if s.MigrationHost == "" {
		return "127.0.0.1"
	}
	return s.MigrationHost
}

// StreamTLS says whether incoming migration streams use TLS (the node has
// a migration TLS identity), or returns why the node cannot receive any:
// without an identity, only a plain stream on loopback that
// migration.plain_loopback allows.
func (s *Server) StreamTLS() (bool, error) {
	identity := statedir.MigrateTLS(s.Config.Runtime.StateDir)
	has, err := HasTLSIdentity(identity)
	if err != nil {
		return false, err
	}
	return streamMode(has, s.Config.Migration.PlainLoopback, s.migrationHost(), identity)
}

// simHost measures what the destination QEMU is handed and signs reports
// with this node's simulated secure processor; HOST_DATA comes with the
// guest.
func (s *Server) simHost(spec vm.Spec, hostData []byte) (*sim.Host, error) {
	var hd [32]byte
	if len(hostData) != 0 && len(hostData) != len(hd) {
		return nil, fmt.Errorf("host_data has %d bytes, want %d", len(hostData), len(hd))
	}
	copy(hd[:], hostData)
	argv, err := vm.Args(spec, sim.Backend{})
	if err != nil {
		return nil, err
	}
	return sim.NewHost(argv, statedir.SimSP(s.Config.Runtime.StateDir), hd)
}

// lookup returns the VM the request's path names if the caller owns it;
// otherwise it answers 404 or 403.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (string, *hostedVM) {
	id := r.PathValue("id")
	h := s.get(id)
	if h == nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("no VM %q on this node", id))
		return id, nil
	}
	if caller := peerOf(r); caller.id != h.owner.id {
		log.G(r.Context()).WithFields(log.Fields{"vm": id, "owner": h.owner.String(), "caller": caller.String()}).Warn("request for a VM another caller migrated here refused")
		writeError(w, http.StatusForbidden, errNotOwner(id, h.owner, caller))
		return id, nil
	}
	return id, h
}

func (s *Server) get(id string) *hostedVM {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vms[id]
}

func (s *Server) status(ctx context.Context, id string, h *hostedVM) VMStatus {
	st := VMStatus{ID: id, Pid: h.vm.Pid()}
	select {
	case <-h.vm.Done():
		st.Exited = true
		if err := h.vm.Err(); err != nil {
			st.Error = err.Error()
		}
	default:
		st.RunState, _ = h.vm.RunState(ctx)
	}
	return st
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	id, h := s.lookup(w, r)
	if h == nil {
		return
	}
	writeJSON(w, http.StatusOK, s.status(r.Context(), id, h))
}

func (s *Server) handleWait(w http.ResponseWriter, r *http.Request) {
	id, h := s.lookup(w, r)
	if h == nil {
		return
	}
	select {
	case <-h.vm.Done():
	case <-r.Context().Done():
		return
	}
	writeJSON(w, http.StatusOK, s.status(r.Context(), id, h))
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	caller := peerOf(r)
	s.mu.Lock()
	h := s.vms[id]
	if h != nil && h.owner.id != caller.id {
		s.mu.Unlock()
		log.G(r.Context()).WithFields(log.Fields{"vm": id, "owner": h.owner.String(), "caller": caller.String()}).Warn("deletion of a VM another caller migrated here refused")
		writeError(w, http.StatusForbidden, errNotOwner(id, h.owner, caller))
		return
	}
	if h != nil {
		delete(s.vms, id)
	}
	s.mu.Unlock()
	if h == nil {
		writeJSON(w, http.StatusOK, map[string]string{})
		return
	}
	if err := h.stop(context.WithoutCancel(r.Context())); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	log.G(r.Context()).WithField("vm", id).Info("VM stopped")
	writeJSON(w, http.StatusOK, map[string]string{})
}

// handleAgent splices the request's connection to the VM's agent channel
// (see Client.DialAgent).
func (s *Server) handleAgent(w http.ResponseWriter, r *http.Request) {
	id, h := s.lookup(w, r)
	if h == nil {
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), agentUpgrade) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("the agent channel needs Upgrade: %s", agentUpgrade))
		return
	}
	agentConn, err := h.vm.DialAgent(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		agentConn.Close()
		writeError(w, http.StatusInternalServerError, errors.New("the connection cannot be taken over"))
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		agentConn.Close()
		return
	}
	if _, err := rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + agentUpgrade + "\r\n\r\n"); err != nil || rw.Flush() != nil {
		conn.Close()
		agentConn.Close()
		return
	}
	go splice(conn, rw.Reader, agentConn, newAnswerTrace(context.WithoutCancel(r.Context()), id, h))
}

// splice copies between the client (whose reader may hold buffered bytes)
// and the agent channel until either side closes, then closes both; tr
// (nil for none) times the channel's first answer.
func splice(client net.Conn, clientR io.Reader, agentConn net.Conn, tr *answerTrace) {
	done := make(chan struct{}, 2)
	var (
		toAgent  io.Reader = clientR
		toClient io.Writer = client
	)
	if tr != nil {
		toAgent, toClient = tr.requests(clientR), tr.replies(client)
	}
	go func() { io.Copy(agentConn, toAgent); done <- struct{}{} }()
	go func() { io.Copy(toClient, agentConn); done <- struct{}{} }()
	<-done
	client.Close()
	agentConn.Close()
	<-done
}
