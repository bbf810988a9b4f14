package mesh

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/policy"
)

// meshPair is two pods' proxies on loopback: the client pod reaches the
// server pod's inbound port through its outbound port. The server pod's
// address is 127.0.0.2; its workload listens on 127.0.0.1.
type meshPair struct {
	ca             *testCA
	server, client *Proxy
	port           int    // the meshed inbound port
	outbound       string // the client workload's local address
	accepted       atomic.Int32
}

func newMeshPair(t *testing.T) *meshPair {
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
	m.server = &Proxy{
		CA:      m.ca.pool,
		Inbound: []initdata.MeshInbound{{Port: uint32(m.port), Allow: []policy.Pattern{idClient}}},
		Addrs:   []net.IP{net.ParseIP("127.0.0.2")},
	}
	m.server.SetCertificate(m.ca.issue(t, idServer, time.Hour))
	if err := m.server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.server.Close)
	out := freePort(t)
	m.outbound = net.JoinHostPort("127.0.0.1", strconv.Itoa(out))
	m.client = &Proxy{
		CA:       m.ca.pool,
		Outbound: []initdata.MeshOutbound{{Port: uint32(out), Upstream: m.inboundAddr(), Identity: idServer}},
	}
	m.client.SetCertificate(m.ca.issue(t, idClient, time.Hour))
	if err := m.client.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.client.Close)
	return m
}

func (m *meshPair) inboundAddr() string {
	return net.JoinHostPort("127.0.0.2", strconv.Itoa(m.port))
}

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

// A port the workload already holds on every address cannot be meshed:
// Start fails instead of leaving plaintext beside the proxy.
func TestProxyStartFailsOnTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	p := &Proxy{CA: newTestCA(t).pool, Addrs: []net.IP{net.ParseIP("127.0.0.2")},
		Inbound: []initdata.MeshInbound{{Port: uint32(port), Allow: []policy.Pattern{idClient}}}}
	if err := p.Start(); err == nil || !strings.Contains(err.Error(), "inbound port") {
		p.Close()
		t.Fatalf("Start = %v, want the port named", err)
	}
}
