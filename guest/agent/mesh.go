package agent

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/google/nftables"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
	"github.com/c8s-dev/c8s/guest/mesh"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/internal/netnsdo"
)

// The attested mesh (guest/mesh): a pod whose measured init data has a
// [mesh] section gets its workload certificate from the owner's mesh CA
// and its meshed ports wrapped in mutual TLS by the agent's transparent
// proxy, all in the pod's network namespace, once the host has wired it
// with the sandbox: the agent redirects the meshed TCP there (nftables)
// before any container of the pod runs. Nothing of it is a host request:
// the init data decides, and the agent talks to the CA itself over the
// pod network.

// meshFirstWait bounds how long creating a container that sees the mesh
// files waits for the pod's first certificate request to end.
var meshFirstWait = 60 * time.Second

// meshState is the pod's mesh: set by SetInitData, started with the
// pod's network.
type meshState struct {
	mu      sync.Mutex
	cfg     *initdata.Mesh
	raw     []byte // the init data the CA reads
	sandbox string // the container whose network namespace it runs in
	netns   *os.File
	proxy   *mesh.Proxy
	renewer *mesh.Renewer
	cancel  context.CancelFunc
	done    chan struct{}
	// netfilter is closed once the netfilter modules are loaded (started
	// by setMesh, in the background, while the host prepares the pod).
	netfilter chan struct{}
}

// meshNetfilterWait bounds how long the sandbox's creation waits for the
// netfilter modules.
var meshNetfilterWait = 2 * time.Minute

// meshTables opens the nftables netlink connection in the pod's network
// namespace nsFd (a variable for tests).
var meshTables = func(nsFd int) (mesh.NFTables, error) {
	return nftables.New(nftables.WithNetNSFd(nsFd))
}

// meshDir is where the pod's mesh files are kept: beside the secrets
// (guest: meshapi.Dir, on a tmpfs of its own).
func (s *Service) meshDir() string {
	return filepath.Join(filepath.Dir(filepath.Clean(s.cfg.SecretsDir)), filepath.Base(meshapi.Dir))
}

// setMesh keeps the [mesh] section of the accepted init data.
func (s *Service) setMesh(doc *initdata.InitData, raw []byte) {
	if !doc.Mesh.Enabled() {
		return
	}
	s.mesh.mu.Lock()
	defer s.mesh.mu.Unlock()
	if s.mesh.cfg == nil {
		s.mesh.cfg, s.mesh.raw = doc.Mesh, append([]byte(nil), raw...)
		// Only a mesh pod pays for the netfilter modules.
		s.mesh.netfilter = make(chan struct{})
		go func(done chan struct{}) {
			defer close(done)
			if s.cfg.LoadNetfilter != nil {
				s.cfg.LoadNetfilter()
			}
		}(s.mesh.netfilter)
	}
}

// startMesh starts the pod's mesh in the network namespace of container
// id (the sandbox, whose init is pid) once the host has wired the pod
// network req there: the proxy binds the meshed ports and the renewer
// asks the CA for the certificate. A proxy that cannot bind fails the
// sandbox: the pod would otherwise run its meshed ports unprotected.
func (s *Service) startMesh(ctx context.Context, id string, req *agentapi.PodNetwork, pid int) error {
	m := &s.mesh
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg == nil || len(req.GetInterfaces()) == 0 {
		return nil
	}
	if m.proxy != nil {
		return fmt.Errorf("container %q: the pod's mesh already runs in sandbox %q: %w", id, m.sandbox, errdefs.ErrFailedPrecondition)
	}
	if m.netfilter != nil {
		t := time.NewTimer(meshNetfilterWait)
		select {
		case <-m.netfilter:
		case <-t.C:
			t.Stop()
			return fmt.Errorf("container %q: mesh: the netfilter modules did not load within %v: %w", id, meshNetfilterWait, errdefs.ErrUnavailable)
		}
		t.Stop()
	}
	nsf, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return fmt.Errorf("mesh: open the pod's network namespace: %w", err)
	}
	nsPath := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), nsf.Fd())
	// The agent's connections in the pod carry the mesh's mark, which the
	// outbound redirect passes.
	dial := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = netnsdo.Do(nsPath, func() error {
			c, err = mesh.DialMarked(ctx, network, addr)
			return err
		})
		return c, err
	}
	listen := func(network, addr string) (l net.Listener, err error) {
		err = netnsdo.Do(nsPath, func() error {
			l, err = net.Listen(network, addr)
			return err
		})
		return l, err
	}
	cfg := m.cfg
	caPool, err := cfg.CAPool()
	if err != nil {
		nsf.Close()
		return err
	}
	roots, err := cfg.CertPool()
	if err != nil {
		nsf.Close()
		return err
	}
	l := log.G(ctx).WithField("identity", cfg.Identity)
	proxy := &mesh.Proxy{
		CA: caPool, Inbound: cfg.Inbound, Outbound: cfg.Outbound,
		Listen: listen, Dial: dial,
		Log: func(msg string, err error) { log.L.WithError(err).Warn("mesh proxy: " + msg) },
	}
	listeners, err := proxy.Start()
	if err != nil {
		nsf.Close()
		return fmt.Errorf("container %q: %w: %w", id, err, errdefs.ErrFailedPrecondition)
	}
	// The redirects, before any container of the pod runs: a pod whose
	// meshed ports cannot be intercepted does not start (it would serve
	// and send them in plaintext).
	redirect, err := proxy.Redirect(listeners)
	if err == nil {
		redirect.Refuse = cfg.RefusesUnmeshed()
		var nft mesh.NFTables
		if nft, err = meshTables(int(nsf.Fd())); err == nil {
			err = redirect.Install(nft)
		}
	}
	if err != nil {
		proxy.Close()
		nsf.Close()
		return fmt.Errorf("container %q: %w: %w", id, err, errdefs.ErrFailedPrecondition)
	}
	dir := s.meshDir()
	if err := s.cfg.MountSecrets(dir); err != nil {
		proxy.Close()
		nsf.Close()
		return fmt.Errorf("mesh: %w", err)
	}
	store := &mesh.Store{Dir: dir}
	client := s.meshClient(cfg, roots, caPool, nsf, m.raw)
	renewer := &mesh.Renewer{
		Request: client.Request,
		Install: func(c *mesh.Certificate) error {
			if err := store.Write(c); err != nil {
				return err
			}
			proxy.SetCertificate(c)
			return nil
		},
		Drop: func(why error) {
			proxy.SetCertificate(nil)
			if err := store.Remove(); err != nil {
				log.L.WithError(err).Warn("mesh: remove the lost certificate's files")
			}
			log.L.WithError(why).WithField("identity", cfg.Identity).Warn("mesh: the pod lost its workload certificate: the proxy refuses every connection")
		},
		Log: func(c *mesh.Certificate, next time.Time, err error) {
			switch {
			case err != nil:
				log.L.WithError(err).WithField("identity", cfg.Identity).WithField("next", next.UTC().Format(time.RFC3339)).Warn("mesh: no workload certificate from the CA")
			case c != nil:
				log.L.WithField("identity", c.Identity).WithField("serial", c.TLS.Leaf.SerialNumber.Text(16)).
					WithField("not_after", c.TLS.Leaf.NotAfter.UTC().Format(time.RFC3339)).WithField("renew_at", next.UTC().Format(time.RFC3339)).Info("mesh: workload certificate issued")
			}
		},
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.sandbox, m.netns, m.proxy, m.renewer, m.cancel, m.done = id, nsf, proxy, renewer, cancel, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		renewer.Run(rctx)
	}(m.done)
	l.WithField("inbound", len(cfg.Inbound)).WithField("outbound", len(cfg.Outbound)).WithField("listeners", listeners).WithField("refuse_unmeshed", cfg.RefusesUnmeshed()).Info("mesh: transparent proxy started, redirects installed")
	return nil
}

// stopMesh stops the mesh when its sandbox, id, is removed: the proxy
// closes, the files go.
func (s *Service) stopMesh(id string) {
	m := &s.mesh
	m.mu.Lock()
	if m.proxy == nil || m.sandbox != id {
		m.mu.Unlock()
		return
	}
	proxy, nsf, cancel, done := m.proxy, m.netns, m.cancel, m.done
	m.proxy, m.netns, m.renewer, m.sandbox = nil, nil, nil, ""
	m.mu.Unlock()
	cancel()
	<-done
	proxy.Close()
	nsf.Close()
	_ = (&mesh.Store{Dir: s.meshDir()}).Remove()
}

// meshContainers names the containers the mesh files are bound into.
func (s *Service) meshContainers() []string {
	m := &s.mesh
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.cfg.Enabled() {
		return nil
	}
	return m.cfg.Containers
}

// meshMounts is the bind mount of the mesh files into a container the
// init data names (mesh.containers; never the sandbox). It waits, within
// meshFirstWait, for the pod's first certificate request, so that the
// workload starts with its certificate when the CA issues one.
func (s *Service) meshMounts(ctx context.Context, grant *policy.Container) []specs.Mount {
	m := &s.mesh
	m.mu.Lock()
	cfg, renewer := m.cfg, m.renewer
	m.mu.Unlock()
	if grant == nil || grant.Identity.Sandbox() || !cfg.MountedInto(grant.Identity.Name) {
		return nil
	}
	if renewer != nil {
		t := time.NewTimer(meshFirstWait)
		select {
		case <-renewer.FirstAttempt():
		case <-ctx.Done():
		case <-t.C:
			log.G(ctx).WithField("container", grant.ID).Warn("mesh: no answer from the mesh CA yet: the container starts without its certificate, which appears in " + meshapi.Dir + " once issued")
		}
		t.Stop()
	}
	dir := s.meshDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil
	}
	return []specs.Mount{{
		Destination: meshapi.Dir, Type: "bind", Source: dir,
		Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
	}}
}

// meshClient is the pod's client of the mesh CA. The CA's URL may name a
// host: its lookups and the dial's attempts are made in the pod's
// namespace netns, marked, one after the other, as a guest pull's are
// (netnsDialer). Go's own dialer would look the name up, and race the
// families, on threads in the VM's namespace. (The proxy's dials are to
// addresses.)
func (s *Service) meshClient(cfg *initdata.Mesh, roots, caPool *x509.CertPool, netns *os.File, raw []byte) *mesh.Client {
	return &mesh.Client{
		URL: cfg.URL, Roots: roots, CA: caPool, CAPEM: []byte(cfg.CA), Identity: cfg.Identity,
		Dial: netnsDialer(netns), Evidence: s.kbsEvidence, InitData: raw,
	}
}
