package mesh

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
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

// Proxy is the pod's transparent L4 mesh proxy. The agent redirects the
// pod's meshed TCP to its listeners (Redirect, nftables in the pod's
// network namespace); the proxy recovers each connection's original
// destination (SO_ORIGINAL_DST) and:
//
//   - Inbound (a peer's connection to a meshed pod port P): terminates
//     mutual TLS 1.3 (a client certificate is required; it must chain to
//     the mesh CA and carry an identity P allows) and forwards plaintext
//     to the workload on 127.0.0.1:P.
//   - Outbound (the workload's connection to a meshed destination
//     PEER:P): opens its own connection to PEER:P, marked so that the
//     redirect passes it, which the peer's redirect hands to the peer's
//     proxy; the peer must present a certificate from the mesh CA with
//     the identity the outbound entry names.
//
// Without a certificate (none yet, or lost) the proxy refuses every
// connection, and dropping the certificate closes those open. A
// plaintext client of a meshed port reaches the inbound listener and
// fails its TLS handshake; nothing reaches the workload's port from
// outside the pod.
type Proxy struct {
	// CA is the mesh CA peers' certificates must chain to.
	CA *x509.CertPool
	// Inbound and Outbound are the init data's [mesh] ports.
	Inbound  []initdata.MeshInbound
	Outbound []initdata.MeshOutbound
	// Listen and Dial open sockets in the pod's network namespace (nil:
	// the caller's). Dial must mark its sockets with Mark (DialMarked),
	// or the proxy's outbound connections are redirected to itself.
	Listen func(network, addr string) (net.Listener, error)
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	// OriginalDst is a connection's destination before the redirect
	// (nil: OriginalDst, from the kernel).
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	// Log is told of refused connections (nil: nothing).
	Log func(msg string, err error)
	// MaxConns bounds the connections the listeners serve at once (0:
	// DefaultMaxConns).
	MaxConns int

	cert atomic.Pointer[Certificate]
	// floor is the newest NotBefore of the pod's certificates, in Unix
	// nanoseconds (now).
	floor atomic.Int64

	mu        sync.Mutex
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	accepted  int // connections the listeners serve
	closed    bool
	wg        sync.WaitGroup
}

// SetCertificate makes c the pod's certificate; nil takes it away and
// closes every proxied connection.
func (p *Proxy) SetCertificate(c *Certificate) {
	if c != nil && c.TLS.Leaf != nil {
		nb := c.TLS.Leaf.NotBefore.UnixNano()
		for {
			old := p.floor.Load()
			if nb <= old || p.floor.CompareAndSwap(old, nb) {
				break
			}
		}
	}
	p.cert.Store(c)
	if c == nil {
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	}
}

// now is the time a peer's certificate is judged at: the guest's clock,
// which the host sets, but never earlier than the newest NotBefore of
// the pod's own certificates, which the CA, on the owner's side, wrote.
// A host that turns the pod's clock back cannot make it accept a peer
// certificate that expired before the pod's last renewal (the withdrawn
// pod's, whose key a compromise may have taken).
func (p *Proxy) now() time.Time {
	t := time.Now()
	if f := p.floor.Load(); f > t.UnixNano() {
		return time.Unix(0, f)
	}
	return t
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
	return DialMarked(ctx, network, addr)
}

func (p *Proxy) originalDst(c net.Conn) (netip.AddrPort, error) {
	if p.OriginalDst != nil {
		return p.OriginalDst(c)
	}
	return OriginalDst(c)
}

// Start binds the proxy's listeners, on ports the kernel picks, and
// serves them until Close: inbound ones on every address, outbound ones
// on loopback, one per IP family. It returns their ports, which the
// redirect points at. A listener that cannot be bound fails Start, with
// those bound so far closed.
func (p *Proxy) Start() (Listeners, error) {
	var ls Listeners
	var bound []func()
	fail := func(err error) (Listeners, error) {
		p.Close()
		return Listeners{}, err
	}
	type listener struct {
		network, addr string
		port          *uint16
		handle        func(net.Conn)
	}
	var want []listener
	if len(p.Inbound) > 0 {
		want = append(want,
			listener{"tcp4", "0.0.0.0:0", &ls.Inbound4, p.inbound},
			listener{"tcp6", "[::]:0", &ls.Inbound6, p.inbound})
	}
	if len(p.Outbound) > 0 {
		want = append(want,
			listener{"tcp4", "127.0.0.1:0", &ls.Outbound4, p.outbound},
			listener{"tcp6", "[::1]:0", &ls.Outbound6, p.outbound})
	}
	for _, w := range want {
		l, err := p.listen(w.network, w.addr)
		if err != nil {
			return fail(fmt.Errorf("mesh: the proxy cannot listen on %s: %w", w.addr, err))
		}
		p.track(l)
		*w.port = uint16(l.Addr().(*net.TCPAddr).Port)
		bound = append(bound, func() { p.serve(l, w.handle) })
	}
	for _, serve := range bound {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			serve()
		}()
	}
	return ls, nil
}

// Redirect is the interception that sends the pod's meshed traffic to
// the listeners ls (Start's).
func (p *Proxy) Redirect(ls Listeners) (*Redirect, error) {
	r := &Redirect{Listeners: ls, Mark: Mark}
	for _, in := range p.Inbound {
		r.Inbound = append(r.Inbound, uint16(in.Port))
	}
	for i, o := range p.Outbound {
		pfs, err := o.Prefixes()
		if err != nil {
			return nil, fmt.Errorf("mesh: outbound[%d]: %w", i, err)
		}
		r.Outbound = append(r.Outbound, OutboundMatch{Port: uint16(o.Port), Peers: pfs})
	}
	return r, nil
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

// DefaultMaxConns bounds the connections the proxy's listeners serve at
// once (each holds two descriptors with its upstream): a host that opens
// connections without end, each in its handshake for up to
// HandshakeTimeout, takes these slots, not every descriptor of the
// agent's.
const DefaultMaxConns = 1024

// acceptBackoffMax is the longest wait after a failed accept.
const acceptBackoffMax = time.Second

// serve accepts l's connections until the listener is closed. A failed
// accept (EMFILE, ENFILE, ENOBUFS: the agent out of descriptors or
// memory for a moment) is retried after a growing wait, never the end of
// the listener; a connection past MaxConns is closed at once.
func (p *Proxy) serve(l net.Listener, handle func(net.Conn)) {
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || p.isClosed() {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), acceptBackoffMax)
			p.logf("accept failed, retrying in "+backoff.String(), err)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if !p.accept(c) {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.release(c)
			handle(c)
		}()
	}
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// accept adds an accepted connection, within MaxConns.
func (p *Proxy) accept(c net.Conn) bool {
	limit := p.MaxConns
	if limit <= 0 {
		limit = DefaultMaxConns
	}
	p.mu.Lock()
	full := p.accepted >= limit
	if !full {
		p.accepted++
	}
	p.mu.Unlock()
	if full {
		p.logf("refused a connection", fmt.Errorf("%d connections are being served already", limit))
		return false
	}
	if !p.add(c) {
		p.release(nil)
		return false
	}
	return true
}

// release removes an accepted connection (nil: only its slot).
func (p *Proxy) release(c net.Conn) {
	if c != nil {
		p.remove(c)
	}
	p.mu.Lock()
	p.accepted--
	p.mu.Unlock()
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

// redirected is the original destination of c, which must have reached
// the listener through the redirect: a connection made to the listener's
// own address (from the pod, or from outside to the inbound listener's
// port) is refused.
func (p *Proxy) redirected(c net.Conn) (netip.AddrPort, error) {
	dst, err := p.originalDst(c)
	if err != nil {
		return dst, err
	}
	if la, ok := c.LocalAddr().(*net.TCPAddr); ok && la.AddrPort().Port() == dst.Port() && la.AddrPort().Addr().Unmap() == dst.Addr().Unmap() {
		return dst, errNotRedirected
	}
	return dst, nil
}

// errNoCertificate refuses connections while the pod has no certificate.
var errNoCertificate = errors.New("the pod has no mesh certificate (not issued yet, or its attestation failed)")

// tlsConfig is the proxy's TLS: 1.3 only, the pod's current certificate,
// and the peer's chain and identity checked against the mesh CA and
// allowed (usage: the peer's role).
func (p *Proxy) tlsConfig(allowed []policy.Pattern, usage x509.ExtKeyUsage) *tls.Config {
	verify := func(cs tls.ConnectionState) error {
		return VerifyPeer(cs.PeerCertificates, p.CA, usage, allowed, p.now())
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
// mesh CA in roots, is valid at now for usage, and its identity matches
// one of allowed.
func VerifyPeer(chain []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, allowed []policy.Pattern, now time.Time) error {
	if len(chain) == 0 {
		return errors.New("mesh: the peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}, CurrentTime: now}); err != nil {
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

// inbound terminates a peer's mutual TLS and forwards to the workload on
// the port the peer connected to.
func (p *Proxy) inbound(c net.Conn) {
	dst, err := p.redirected(c)
	if err != nil {
		p.logf(fmt.Sprintf("inbound: refused %s", c.RemoteAddr()), err)
		return
	}
	i := slices.IndexFunc(p.Inbound, func(in initdata.MeshInbound) bool { return in.Port == uint32(dst.Port()) })
	if i < 0 {
		p.logf(fmt.Sprintf("inbound: refused %s", c.RemoteAddr()), fmt.Errorf("port %d is not meshed", dst.Port()))
		return
	}
	in := p.Inbound[i]
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

// outbound wraps a workload's connection in mutual TLS to the peer it
// was opened to.
func (p *Proxy) outbound(c net.Conn) {
	dst, err := p.redirected(c)
	if err != nil {
		p.logf("outbound: refused", err)
		return
	}
	i := slices.IndexFunc(p.Outbound, func(o initdata.MeshOutbound) bool { return o.Covers(dst) })
	if i < 0 {
		p.logf(fmt.Sprintf("outbound to %s: refused", dst), errors.New("no outbound entry covers it"))
		return
	}
	out := p.Outbound[i]
	if p.cert.Load() == nil {
		p.logf(fmt.Sprintf("outbound to %s: refused", dst), errNoCertificate)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := p.dial(ctx, "tcp", dst.String())
	cancel()
	if err != nil {
		p.logf(fmt.Sprintf("outbound to %s: dial", dst), err)
		return
	}
	if !p.add(up) {
		up.Close()
		return
	}
	defer p.remove(up)
	tc := tls.Client(up, p.tlsConfig([]policy.Pattern{out.Identity}, x509.ExtKeyUsageServerAuth))
	if err := handshake(tc); err != nil {
		p.logf(fmt.Sprintf("outbound to %s: refused", dst), err)
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
