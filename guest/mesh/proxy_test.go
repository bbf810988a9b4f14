package mesh

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/policy"
)

// meshPair is two pods' proxies on loopback, with the redirects faked:
// the client workload connects to the client proxy's outbound listener
// as if it had dialled the server pod (serverPod), the client proxy's dial
// to serverPod reaches the server proxy's inbound listener, and both
// proxies see serverPod as the original destination. The server
// workload listens on 127.0.0.1:port.
type meshPair struct {
	ca             *testCA
	server, client *Proxy
	port           int    // the meshed port
	serverPod      string // the server pod's address and meshed port
	inbound        string // the server proxy's inbound listener
	outbound       string // the client proxy's outbound listener
	accepted       atomic.Int32
}

func newMeshPair(t *testing.T) *meshPair { return newMeshPairWith(t, nil) }

// newMeshPairWith is newMeshPair with both proxies' OriginalDst dst.
func newMeshPairWith(t *testing.T, dst func(net.Conn) (netip.AddrPort, error)) *meshPair {
	t.Helper()
	m := &meshPair{ca: newTestCA(t)}
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			m.accepted.Add(1)
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					io.WriteString(c, "echo:"+line)
				}
			}()
		}
	}()
	m.port = backend.Addr().(*net.TCPAddr).Port
	pod := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(m.port))
	m.serverPod = pod.String()
	plainDial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	toPod := func(net.Conn) (netip.AddrPort, error) { return pod, nil }
	if dst != nil {
		toPod = dst
	}
	m.server = &Proxy{
		CA:          m.ca.pool,
		Inbound:     []initdata.MeshInbound{{Port: uint32(m.port), Allow: []policy.Pattern{idClient}}},
		Dial:        plainDial,
		OriginalDst: toPod,
	}
	m.server.SetCertificate(m.ca.issue(t, idServer, time.Hour))
	ls, err := m.server.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.server.Close)
	m.inbound = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ls.Inbound4)))
	m.client = &Proxy{
		CA:       m.ca.pool,
		Outbound: []initdata.MeshOutbound{{Port: uint32(m.port), Peers: []string{"127.0.0.0/24"}, Identity: idServer}},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == m.serverPod { // the server pod's redirect
				addr = m.inbound
			}
			return plainDial(ctx, network, addr)
		},
		OriginalDst: toPod,
	}
	m.client.SetCertificate(m.ca.issue(t, idClient, time.Hour))
	ls, err = m.client.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.client.Close)
	m.outbound = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ls.Outbound4)))
	return m
}

func (m *meshPair) inboundAddr() string { return m.inbound }

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// roundTrip sends a line on c and returns the answer.
func roundTrip(c net.Conn, line string) (string, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestProxyMutualTLS(t *testing.T) {
	m := newMeshPair(t)
	c, err := net.Dial("tcp", m.outbound)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hello"); err != nil || got != "echo:hello\n" {
		t.Fatalf("through the mesh: %q, %v", got, err)
	}
	if m.accepted.Load() != 1 {
		t.Fatalf("the workload accepted %d connections, want 1", m.accepted.Load())
	}
}

// A client the inbound port must refuse, and the workload must never see.
func TestProxyInboundRefused(t *testing.T) {
	m := newMeshPair(t)
	other := newTestCA(t)
	tls13 := func(cert *Certificate) *tls.Config {
		cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{cert.TLS}
		}
		return cfg
	}
	for name, cfg := range map[string]*tls.Config{
		"no client certificate":    tls13(nil),
		"a certificate of another": tls13(other.issue(t, idClient, time.Hour)),
		"a wrong identity":         tls13(m.ca.issue(t, idOther, time.Hour)),
		"an expired certificate":   tls13(m.ca.issue(t, idClient, -time.Second)),
		"TLS 1.2":                  {InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12, Certificates: []tls.Certificate{m.ca.issue(t, idClient, time.Hour).TLS}},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := tls.Dial("tcp", m.inboundAddr(), cfg)
			if err == nil {
				// TLS 1.3: the server judges the client's certificate
				// after the client's handshake ends; its alert comes
				// with the first read.
				_, err = roundTrip(c, "hello")
				c.Close()
			}
			if err == nil {
				t.Fatal("the inbound port answered")
			}
			if m.accepted.Load() != 0 {
				t.Fatal("the workload got a connection")
			}
		})
	}
	t.Run("plaintext", func(t *testing.T) {
		c, err := net.Dial("tcp", m.inboundAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got, err := roundTrip(c, "GET / HTTP/1.0\r"); err == nil || strings.Contains(got, "echo") {
			t.Fatalf("plaintext answered %q", got)
		}
		if m.accepted.Load() != 0 {
			t.Fatal("the workload got a connection")
		}
	})
	// The allowed client gets through: the refusals were the checks.
	c, err := tls.Dial("tcp", m.inboundAddr(), tls13(m.ca.issue(t, idClient, time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hi"); err != nil || got != "echo:hi\n" {
		t.Fatalf("allowed client: %q, %v", got, err)
	}
}

// The outbound side refuses an upstream that is not the identity the init
// data names, or not from the mesh CA.
func TestProxyOutboundChecksUpstream(t *testing.T) {
	m := newMeshPair(t)
	for name, cert := range map[string]*Certificate{
		"a wrong identity":      m.ca.issue(t, idOther, time.Hour),
		"another CA's identity": newTestCA(t).issue(t, idServer, time.Hour),
	} {
		t.Run(name, func(t *testing.T) {
			m.server.SetCertificate(cert)
			c, err := net.Dial("tcp", m.outbound)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got, err := roundTrip(c, "hello"); err == nil {
				t.Fatalf("answered %q", got)
			}
			if m.accepted.Load() != 0 {
				t.Fatal("the server workload got a connection")
			}
		})
	}
}

// A pod that loses its certificate refuses new connections and closes
// open ones; one that gets it back serves again.
func TestProxyCertificateLost(t *testing.T) {
	m := newMeshPair(t)
	open, err := net.Dial("tcp", m.outbound)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := roundTrip(open, "one"); err != nil {
		t.Fatal(err)
	}
	m.server.SetCertificate(nil)
	if got, err := roundTrip(open, "two"); err == nil {
		t.Fatalf("an open connection still answered %q after the certificate was lost", got)
	}
	c, err := net.Dial("tcp", m.outbound)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(c, "three"); err == nil {
		t.Fatalf("a new connection answered %q without the server's certificate", got)
	}
	c.Close()
	m.server.SetCertificate(m.ca.issue(t, idServer, time.Hour))
	c, err = net.Dial("tcp", m.outbound)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "four"); err != nil || got != "echo:four\n" {
		t.Fatalf("after renewal: %q, %v", got, err)
	}
}

// A connection the proxy cannot place is refused: one to a port the
// init data does not mesh, one that reached a listener without a
// redirect (its original destination is the listener itself), one
// whose original destination the kernel does not know.
func TestProxyRefusesUnplaced(t *testing.T) {
	for name, dst := range map[string]func(c net.Conn) (netip.AddrPort, error){
		"unmeshed port": func(net.Conn) (netip.AddrPort, error) {
			return netip.MustParseAddrPort("127.0.0.2:1"), nil
		},
		"not redirected": func(c net.Conn) (netip.AddrPort, error) {
			return c.LocalAddr().(*net.TCPAddr).AddrPort(), nil
		},
		"no original destination": func(net.Conn) (netip.AddrPort, error) {
			return netip.AddrPort{}, errors.New("ENOENT")
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := newMeshPairWith(t, dst)
			for side, addr := range map[string]string{"inbound": m.inbound, "outbound": m.outbound} {
				c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{m.ca.issue(t, idClient, time.Hour).TLS}})
				if err == nil {
					_, err = roundTrip(c, "hello")
					c.Close()
				}
				if err == nil {
					t.Fatalf("%s: answered", side)
				}
			}
			if m.accepted.Load() != 0 {
				t.Fatal("the workload got a connection")
			}
		})
	}
}

// Start binds the listeners the redirect points at, and Redirect names
// them with the init data's ports.
func TestProxyStartListeners(t *testing.T) {
	m := newMeshPair(t)
	p := &Proxy{CA: m.ca.pool,
		Inbound:  []initdata.MeshInbound{{Port: 8080, Allow: []policy.Pattern{idClient}}},
		Outbound: []initdata.MeshOutbound{{Port: 5432, Peers: []string{"10.0.0.0/8", "fd00::1"}, Identity: idServer}}}
	ls, err := p.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if ls.Inbound4 == 0 || ls.Inbound6 == 0 || ls.Outbound4 == 0 || ls.Outbound6 == 0 {
		t.Fatalf("listeners %+v: want all four", ls)
	}
	r, err := p.Redirect(ls)
	if err != nil {
		t.Fatal(err)
	}
	want := []OutboundMatch{{Port: 5432, Peers: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::1/128")}}}
	if !slices.Equal(r.Inbound, []uint16{8080}) || !reflect.DeepEqual(r.Outbound, want) || r.Listeners != ls || r.Mark != Mark {
		t.Fatalf("Redirect = %+v", r)
	}
	// The outbound listeners are on loopback, where the output redirect
	// sends IPv4 (127.0.0.1) and IPv6 (::1).
	for _, a := range []string{"127.0.0.1", "::1"} {
		port := ls.Outbound4
		if a == "::1" {
			port = ls.Outbound6
		}
		c, err := net.Dial("tcp", net.JoinHostPort(a, strconv.Itoa(int(port))))
		if err != nil {
			t.Fatalf("outbound listener on %s: %v", a, err)
		}
		c.Close()
	}
}

// A workload that connects to the outbound listener itself, not through
// the redirect, is refused even when the listener's port is a meshed one
// (the kernel may pick any free port): the proxy would otherwise dial its
// own listener, without end.
func TestProxyOutboundNotRedirectedNoLoop(t *testing.T) {
	ca := newTestCA(t)
	port := freePort(t)
	var dials atomic.Int32
	p := &Proxy{
		CA:       ca.pool,
		Outbound: []initdata.MeshOutbound{{Port: uint32(port), Identity: idServer}},
		Listen: func(network, addr string) (net.Listener, error) {
			if addr == "127.0.0.1:0" {
				addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			}
			return net.Listen(network, addr)
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return nil, errors.New("no dial expected")
		},
		// Without a redirect the kernel's original destination is the
		// connection's own local address.
		OriginalDst: func(c net.Conn) (netip.AddrPort, error) { return c.LocalAddr().(*net.TCPAddr).AddrPort(), nil },
	}
	p.SetCertificate(ca.issue(t, idClient, time.Hour))
	if _, err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hello"); err == nil {
		t.Fatalf("answered %q", got)
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("the proxy dialled %d times for a connection to itself", n)
	}
}

// TestMaliciousHostTurnsTheClockBack: a pod withdrawn from the mesh keeps
// its last certificate and key (a compromise took them), and the host
// turns back the clock of a victim pod so that the expired certificate
// reads as valid. The victim's own certificate, from the owner's CA, says
// the time is later than its NotBefore: a peer certificate that expired
// before it is refused, whatever the guest's clock says. One still valid
// then is taken.
func TestMaliciousHostTurnsTheClockBack(t *testing.T) {
	m := newMeshPair(t)
	now := time.Now()
	// The CA's time is 3 h past the victim's clock: the victim renewed
	// then.
	m.server.SetCertificate(m.ca.issueFor(t, idServer, now.Add(3*time.Hour), now.Add(4*time.Hour)))
	dial := func(cert *Certificate) error {
		c, err := tls.Dial("tcp", m.inboundAddr(), &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert.TLS}})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = roundTrip(c, "hi")
		return err
	}
	if err := dial(m.ca.issueFor(t, idClient, now.Add(-2*time.Hour), now.Add(time.Hour))); err == nil {
		t.Fatal("a peer certificate that expired before the pod's own was issued was taken on the pod's (turned back) clock")
	}
	if m.accepted.Load() != 0 {
		t.Fatal("the workload got the connection")
	}
	if err := dial(m.ca.issueFor(t, idClient, now.Add(2*time.Hour), now.Add(5*time.Hour))); err != nil {
		t.Fatalf("a peer certificate valid at the CA's time: %v", err)
	}
}
