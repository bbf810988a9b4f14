package portfwd

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/vishvananda/netlink"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/internal/netnsdo"
)

// fakePod is the guest side of port-forward: its "pod" ports are
// listeners on the host's loopback, and ListenPorts reports the set the
// test chooses (or denied, as a policy without port-forward does).
type fakePod struct {
	mu      sync.Mutex
	ports   []uint32
	denied  bool
	changed chan struct{}
	next    uint64
	conns   map[uint64]*net.TCPConn
	dials   []uint32
}

func newFakePod() *fakePod {
	return &fakePod{changed: make(chan struct{}), conns: map[uint64]*net.TCPConn{}}
}

func (p *fakePod) set(ports []uint32, denied bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ports, p.denied = ports, denied
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *fakePod) ListenPorts(ctx context.Context, r *agent.ListenPortsRequest) (*agent.ListenPortsResponse, error) {
	for {
		p.mu.Lock()
		ports, denied, changed := slices.Clone(p.ports), p.denied, p.changed
		p.mu.Unlock()
		if denied {
			return nil, errgrpc.ToGRPC(fmt.Errorf("policy says no: %w", errdefs.ErrPermissionDenied))
		}
		if !r.KnownSet || !slices.Equal(ports, r.Known) {
			return &agent.ListenPortsResponse{Ports: ports}, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}

func (p *fakePod) Dial(ctx context.Context, r *agent.DialRequest) (*agent.DialResponse, error) {
	c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(r.Port))))
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	p.conns[p.next] = c.(*net.TCPConn)
	p.dials = append(p.dials, r.Port)
	return &agent.DialResponse{ConnId: p.next}, nil
}

func (p *fakePod) conn(id uint64) (*net.TCPConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[id]; c != nil {
		return c, nil
	}
	return nil, errgrpc.ToGRPC(errdefs.ErrNotFound)
}

func (p *fakePod) Read(ctx context.Context, r *agent.ConnReadRequest) (*agent.ConnReadResponse, error) {
	c, err := p.conn(r.ConnId)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, r.MaxBytes)
	n, err := c.Read(buf)
	if n > 0 {
		return &agent.ConnReadResponse{Data: buf[:n]}, nil
	}
	if err == io.EOF {
		return &agent.ConnReadResponse{Eof: true}, nil
	}
	return nil, err
}

func (p *fakePod) Write(ctx context.Context, r *agent.ConnWriteRequest) (*agent.ConnWriteResponse, error) {
	c, err := p.conn(r.ConnId)
	if err != nil {
		return nil, err
	}
	n, err := c.Write(r.Data)
	return &agent.ConnWriteResponse{Written: uint32(n)}, err
}

func (p *fakePod) Close(ctx context.Context, r *agent.ConnCloseRequest) (*agent.Empty, error) {
	c, err := p.conn(r.ConnId)
	if err != nil {
		return nil, err
	}
	if r.WriteOnly {
		return &agent.Empty{}, c.CloseWrite()
	}
	p.mu.Lock()
	delete(p.conns, r.ConnId)
	p.mu.Unlock()
	return &agent.Empty{}, c.Close()
}

func (p *fakePod) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// podNetNS is a scratch network namespace with its loopback up, as CNI's
// loopback plugin leaves a pod's.
func podNetNS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	name := fmt.Sprintf("c8spf-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	path, err := netnsdo.Create(name, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netnsdo.Remove(name) })
	return path
}

// upperEcho listens on the host loopback and answers each connection with
// its input upper-cased once the client half-closes.
func upperEcho(t *testing.T) uint32 {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				for i := range b {
					if b[i] >= 'a' && b[i] <= 'z' {
						b[i] -= 32
					}
				}
				c.Write(b)
			}()
		}
	}()
	return uint32(l.Addr().(*net.TCPAddr).Port)
}

// dialIn dials localhost:port inside netns, as containerd's PortForward
// does, sends msg, half-closes and returns the reply.
func dialIn(netns string, port uint32, msg string) (string, error) {
	var c net.Conn
	err := netnsdo.Do(netns, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", net.JoinHostPort("localhost", strconv.Itoa(int(port))), 2*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	return string(b), err
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// A pod port appears on the pod namespace's loopback, where containerd
// dials it, carries data both ways with half-close, and disappears when
// the pod stops listening.
func TestForwarderMirrorsAndRelays(t *testing.T) {
	netns := podNetNS(t)
	port := upperEcho(t)
	pod := newFakePod()
	pod.set([]uint32{port}, false)
	f := Start(context.Background(), netns, pod)
	defer f.Close()
	waitFor(t, "the port's listener", func() bool { return slices.Equal(f.Ports(), []uint32{port}) })

	for i := range 3 {
		msg := fmt.Sprintf("hello %d from the client", i)
		got, err := dialIn(netns, port, msg)
		if err != nil {
			t.Fatalf("dial the pod port in its namespace: %v", err)
		}
		if want := fmt.Sprintf("HELLO %d FROM THE CLIENT", i); got != want {
			t.Fatalf("reply %q, want %q", got, want)
		}
	}
	waitFor(t, "the guest side of each connection to be closed", func() bool { return pod.open() == 0 })

	// A port outside the pod's set has no listener: the dial is refused in
	// the namespace and never reaches the pod.
	if _, err := dialIn(netns, port+1, "x"); err == nil {
		t.Fatal("a port the pod does not report accepted a connection")
	}
	pod.set(nil, false)
	waitFor(t, "the listener to go", func() bool { return len(f.Ports()) == 0 })
	if _, err := dialIn(netns, port, "x"); err == nil {
		t.Fatal("the port still accepts connections after the pod stopped listening")
	}
	if len(pod.dials) != 3 {
		t.Fatalf("the pod got %d dials, want 3", len(pod.dials))
	}
}

// A pod whose policy allows no port-forward gets no listener, and the
// forwarder stops asking.
func TestForwarderStopsWhenDenied(t *testing.T) {
	netns := podNetNS(t)
	pod := newFakePod()
	pod.set(nil, true)
	f := Start(context.Background(), netns, pod)
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the forwarder kept watching after the pod's policy denied port-forward")
	}
	f.Close()
	if len(f.Ports()) != 0 {
		t.Fatalf("listeners %v under a denying policy", f.Ports())
	}
}

// Close ends listeners and open connections, and returns once every
// goroutine is gone.
func TestForwarderCloseEndsConnections(t *testing.T) {
	netns := podNetNS(t)
	// A pod port that accepts and never answers.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	port := uint32(l.Addr().(*net.TCPAddr).Port)
	pod := newFakePod()
	pod.set([]uint32{port}, false)
	f := Start(context.Background(), netns, pod)
	waitFor(t, "the port's listener", func() bool { return len(f.Ports()) == 1 })
	var c net.Conn
	if err := netnsdo.Do(netns, func() error {
		c, err = net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, "the relay to open", func() bool { return pod.open() == 1 })
	closed := make(chan struct{})
	go func() { f.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung with a connection open")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("client read after Close: %v, want EOF", err)
	}
	if pod.open() != 0 {
		t.Fatalf("%d guest connections left open after Close", pod.open())
	}
}
