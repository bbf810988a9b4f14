package mesh

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/policy"
)

// failingAccepts fails its first n Accepts as the kernel does when the
// agent is out of descriptors (EMFILE).
type failingAccepts struct {
	net.Listener
	n atomic.Int32
}

func (l *failingAccepts) Accept() (net.Conn, error) {
	if l.n.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// inboundProxy starts a proxy with one inbound port whose IPv4 listener
// is wrapped by wrap, and returns its address.
func inboundProxy(t *testing.T, maxConns int, dst func(net.Conn) (netip.AddrPort, error), wrap func(net.Listener) net.Listener) (*Proxy, string) {
	t.Helper()
	ca := newTestCA(t)
	p := &Proxy{CA: ca.pool, Inbound: []initdata.MeshInbound{{Port: 1, Allow: []policy.Pattern{idClient}}}, MaxConns: maxConns, OriginalDst: dst,
		Listen: func(network, addr string) (net.Listener, error) {
			l, err := net.Listen(network, addr)
			if err == nil && network == "tcp4" {
				return wrap(l), nil
			}
			return l, err
		}}
	p.SetCertificate(ca.issue(t, idServer, time.Hour))
	ls, err := p.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, "127.0.0.1:" + strconv.Itoa(int(ls.Inbound4))
}

// served reports whether the proxy took c up and closed it within d (one
// no redirect placed, or one past MaxConns, is closed at once); one it
// does not take up waits in the listener's backlog, one in its handshake
// waits for a ClientHello.
func served(t *testing.T, c net.Conn, d time.Duration) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestMaliciousHostExhaustsDescriptors: a failed accept (the agent out of
// descriptors while the host holds thousands of connections open) is
// retried; before, the listener stopped for good and the pod's mesh was
// dead until its sandbox was recreated.
func TestMaliciousHostExhaustsDescriptors(t *testing.T) {
	_, addr := inboundProxy(t, 0, nil, func(l net.Listener) net.Listener {
		f := &failingAccepts{Listener: l}
		f.n.Store(3)
		return f
	})
	if !served(t, dial(t, addr), 3*time.Second) {
		t.Fatal("after three failed accepts the inbound listener serves no more")
	}
}

// TestMaliciousHostHoldsConnections: the connections the listeners serve
// at once are bounded; one past the bound is closed at once, and a slot
// freed is served again.
func TestMaliciousHostHoldsConnections(t *testing.T) {
	// Redirected to the meshed port: the proxy waits for each one's
	// ClientHello (up to HandshakeTimeout).
	redirected := func(net.Conn) (netip.AddrPort, error) { return netip.MustParseAddrPort("10.1.0.9:1"), nil }
	_, addr := inboundProxy(t, 3, redirected, func(l net.Listener) net.Listener { return l })
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	for _, c := range held {
		if served(t, c, 300*time.Millisecond) {
			t.Fatal("a connection in its handshake was closed")
		}
	}
	if !served(t, dial(t, addr), 2*time.Second) {
		t.Fatal("a fourth connection with three held is not closed at once")
	}
	held[0].Close()
	time.Sleep(200 * time.Millisecond)
	if served(t, dial(t, addr), 300*time.Millisecond) {
		t.Fatal("with a slot freed, a new connection is still closed at once")
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
