package mesh

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
	"github.com/c8s-dev/c8s/guest/api/policy"
)

// HandshakeTimeout bounds a TLS handshake of the proxy.
const HandshakeTimeout = 15 * time.Second

// Proxy is the pod's L4 mesh proxy. The guest kernel has no netfilter
// modules, so nothing is redirected: ports are split by address.
//
//   - Inbound: for each meshed port P the proxy listens on the pod's
//     addresses (Addrs), port P, terminates mutual TLS 1.3 (a client
//     certificate is required; it must chain to the mesh CA and carry an
//     identity the port allows) and forwards plaintext to 127.0.0.1:P,
//     where the workload listens. A workload that binds P on every
//     address fails (the proxy holds POD_IP:P), rather than serving
//     plaintext beside the proxy.
//   - Outbound: for each declared upstream the proxy listens on
//     127.0.0.1:PORT; a connection there is carried to the upstream in
//     mutual TLS 1.3, and the upstream must present a certificate from
//     the mesh CA with the identity the init data names.
//
// Without a certificate (none yet, or lost) the proxy refuses every
// connection, and dropping the certificate closes those open.
type Proxy struct {
	// CA is the mesh CA peers' certificates must chain to.
	CA *x509.CertPool
	// Inbound and Outbound are the init data's [mesh] ports.
	Inbound  []initdata.MeshInbound
	Outbound []initdata.MeshOutbound
	// Addrs are the pod's addresses, where inbound ports listen.
	Addrs []net.IP
	// Listen and Dial open sockets in the pod's network namespace (nil:
	// the caller's).
	Listen func(network, addr string) (net.Listener, error)
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	// Log is told of refused connections (nil: nothing).
	Log func(msg string, err error)

	cert atomic.Pointer[Certificate]

	mu        sync.Mutex
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// SetCertificate makes c the pod's certificate; nil takes it away and
// closes every proxied connection.
func (p *Proxy) SetCertificate(c *Certificate) {
	p.cert.Store(c)
	if c == nil {
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	}
}

func (p *Proxy) logf(msg string, err error) {
	if p.Log != nil {
		p.Log(msg, err)
	}
}

func (p *Proxy) listen(network, addr string) (net.Listener, error) {
	if p.Listen != nil {
		return p.Listen(network, addr)
	}
	return net.Listen(network, addr)
}

func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if p.Dial != nil {
		return p.Dial(ctx, network, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// Start binds every meshed port and serves them until Close. A port that
// cannot be bound fails Start, with the ports bound so far closed.
func (p *Proxy) Start() error {
	var bound []func()
	fail := func(err error) error {
		p.Close()
		return err
	}
	for _, in := range p.Inbound {
		if len(p.Addrs) == 0 {
			return fail(errors.New("mesh: the pod has no address to listen on for inbound ports"))
		}
		for _, ip := range p.Addrs {
			addr := net.JoinHostPort(ip.String(), strconv.Itoa(int(in.Port)))
			l, err := p.listen("tcp", addr)
			if err != nil {
				return fail(fmt.Errorf("mesh: listen on %s (inbound port %d): %w", addr, in.Port, err))
			}
			p.track(l)
			in := in
			bound = append(bound, func() { p.serve(l, func(c net.Conn) { p.inbound(c, in) }) })
		}
	}
	for _, out := range p.Outbound {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(out.Port)))
		l, err := p.listen("tcp", addr)
		if err != nil {
			return fail(fmt.Errorf("mesh: listen on %s (outbound to %s): %w", addr, out.Upstream, err))
		}
		p.track(l)
		out := out
		bound = append(bound, func() { p.serve(l, func(c net.Conn) { p.outbound(c, out) }) })
	}
	for _, serve := range bound {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			serve()
		}()
	}
	return nil
}

func (p *Proxy) track(l net.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listeners = append(p.listeners, l)
}

// Close stops listening and closes every proxied connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for _, l := range p.listeners {
		l.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) serve(l net.Listener, handle func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		if !p.add(c) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.remove(c)
			handle(c)
		}()
	}
}

func (p *Proxy) add(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if p.conns == nil {
		p.conns = map[net.Conn]struct{}{}
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) remove(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

// errNoCertificate refuses connections while the pod has no certificate.
var errNoCertificate = errors.New("the pod has no mesh certificate (not issued yet, or its attestation failed)")

// tlsConfig is the proxy's TLS: 1.3 only, the pod's current certificate,
// and the peer's chain and identity checked against the mesh CA and
// allowed (usage: the peer's role).
func (p *Proxy) tlsConfig(allowed []policy.Pattern, usage x509.ExtKeyUsage) *tls.Config {
	verify := func(cs tls.ConnectionState) error {
		return VerifyPeer(cs.PeerCertificates, p.CA, usage, allowed)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if c := p.cert.Load(); c != nil {
				return &c.TLS, nil
			}
			return nil, errNoCertificate
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := p.cert.Load(); c != nil {
				return &c.TLS, nil
			}
			return nil, errNoCertificate
		},
		// The chain is checked by VerifyConnection against the mesh CA,
		// and the peer by its SPIFFE ID, not by a host name: Go's own
		// host-name check does not apply to workload certificates.
		ClientAuth:         tls.RequireAnyClientCert,
		InsecureSkipVerify: true,
		VerifyConnection:   verify,
	}
}

// VerifyPeer checks a mesh peer's certificate chain: it leads to the
// mesh CA in roots, is valid now for usage, and its identity matches one
// of allowed.
func VerifyPeer(chain []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, allowed []policy.Pattern) error {
	if len(chain) == 0 {
		return errors.New("mesh: the peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("mesh: the peer's certificate is not from the mesh CA: %w", err)
	}
	id, err := meshapi.Identity(chain[0])
	if err != nil {
		return fmt.Errorf("mesh: the peer's certificate: %w", err)
	}
	if !policy.MatchAny(allowed, id) {
		return fmt.Errorf("mesh: peer %s is not allowed (allowed: %v)", id, policy.Strings(allowed))
	}
	return nil
}

// inbound terminates a peer's mutual TLS and forwards to the workload.
func (p *Proxy) inbound(c net.Conn, in initdata.MeshInbound) {
	if p.cert.Load() == nil {
		p.logf(fmt.Sprintf("inbound port %d: refused %s", in.Port, c.RemoteAddr()), errNoCertificate)
		return
	}
	tc := tls.Server(c, p.tlsConfig(in.Allow, x509.ExtKeyUsageClientAuth))
	if err := handshake(tc); err != nil {
		p.logf(fmt.Sprintf("inbound port %d: refused %s", in.Port, c.RemoteAddr()), err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	backend, err := p.dial(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(in.Port))))
	cancel()
	if err != nil {
		p.logf(fmt.Sprintf("inbound port %d: the workload does not listen on 127.0.0.1:%d", in.Port, in.Port), err)
		return
	}
	if !p.add(backend) {
		backend.Close()
		return
	}
	defer p.remove(backend)
	pipe(tc, backend)
}

// outbound wraps a workload's connection in mutual TLS to the upstream.
func (p *Proxy) outbound(c net.Conn, out initdata.MeshOutbound) {
	if p.cert.Load() == nil {
		p.logf(fmt.Sprintf("outbound to %s: refused", out.Upstream), errNoCertificate)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := p.dial(ctx, "tcp", out.Upstream)
	cancel()
	if err != nil {
		p.logf(fmt.Sprintf("outbound to %s: dial", out.Upstream), err)
		return
	}
	if !p.add(up) {
		up.Close()
		return
	}
	defer p.remove(up)
	tc := tls.Client(up, p.tlsConfig([]policy.Pattern{out.Identity}, x509.ExtKeyUsageServerAuth))
	if err := handshake(tc); err != nil {
		p.logf(fmt.Sprintf("outbound to %s: refused", out.Upstream), err)
		return
	}
	pipe(c, tc)
}

func handshake(tc *tls.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), HandshakeTimeout)
	defer cancel()
	return tc.HandshakeContext(ctx)
}

// pipe copies both ways until both directions end; a side's EOF is
// passed on as a half-close.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
}
