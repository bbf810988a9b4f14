package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/internal/netnsdo"
)

const (
	// maxForwardConns bounds the port-forward connections open at once,
	// so that a host cannot exhaust the guest's memory or sockets.
	maxForwardConns = 256
	// maxForwardWrite bounds one Write's data (the shim sends 32 KiB): with
	// one write at a time per connection, what blocked writes hold in the
	// agent is at most maxForwardConns times this, 64 MiB.
	maxForwardWrite = 256 << 10
	// portPollInterval is how often ListenPorts re-reads the listening
	// sockets while it waits for a change.
	portPollInterval = 200 * time.Millisecond
	// maxPortWait caps ListenPorts' wait.
	maxPortWait = 60 * time.Second
)

// portForward is the agent's PortForward service (CRI port-forward). Every
// call is a host request into the pod: it needs the pod's policy in force
// and the port allowed by it.
type portForward struct {
	s *Service

	mu      sync.Mutex
	next    uint64
	dialing int // Dials holding a slot of maxForwardConns
	conns   map[uint64]*fwdConn
}

// fwdConn is one port-forward connection. It serves one Read and one Write
// at a time: every request the host sends ahead holds memory in the agent
// (a Write's data, a Read's buffer). A second Write while the first blocks
// is refused. A second Read ends the one that waits and takes its turn:
// the shim retries a Read that a live migration cut off, whose original
// still waits in the guest.
type fwdConn struct {
	*net.TCPConn
	readTurn chan struct{} // holds a token while a Read runs
	writing  atomic.Bool
}

func newFwdConn(c *net.TCPConn) *fwdConn {
	return &fwdConn{TCPConn: c, readTurn: make(chan struct{}, 1)}
}

// takeReadTurn waits for the Read in progress to end, ending its wait for
// data, and returns with the turn, or ctx's error.
func (c *fwdConn) takeReadTurn(ctx context.Context) error {
	for {
		select {
		case c.readTurn <- struct{}{}:
			_ = c.SetReadDeadline(time.Time{})
			return nil
		default:
		}
		_ = c.SetReadDeadline(time.Unix(1, 0))
		select {
		case c.readTurn <- struct{}{}:
			_ = c.SetReadDeadline(time.Time{})
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

var _ agentapi.PortForwardService = (*portForward)(nil)

func newPortForward(s *Service) *portForward {
	return &portForward{s: s, conns: map[uint64]*fwdConn{}}
}

// allowed returns nil if the pod's policy lets the host forward to port,
// or, with port 0, to any port at all.
func (p *portForward) allowed(ctx context.Context, what string, port uint32) error {
	if err := p.s.requirePolicy(ctx, what); err != nil {
		return err
	}
	p.s.mu.Lock()
	pol, zeroLaunch := p.s.policy, p.s.zeroLaunch
	p.s.mu.Unlock()
	if zeroLaunch && !pol.AnyPortForwardAllowed() {
		return fmt.Errorf("%s refused: this pod VM was started as %s and launched without init data, and the agent's built-in policy for it (%s) allows no port-forward: launch the pod with measured init data whose agent_policy.allow_port_forward lists the port: %w",
			what, p.s.cfg.TEE, policyapi.ZeroLaunchName, errdefs.ErrPermissionDenied)
	}
	if port == 0 {
		if !pol.AnyPortForwardAllowed() {
			return fmt.Errorf("%s refused: the pod's policy allows no port-forward (agent_policy.allow_port_forward is empty): %w", what, errdefs.ErrPermissionDenied)
		}
		return nil
	}
	if !pol.PortForwardAllowed(port) {
		return fmt.Errorf("%s refused: port %d is not in the pod's agent_policy.allow_port_forward %v: %w", what, port, pol.AllowPortForward, errdefs.ErrPermissionDenied)
	}
	return nil
}

// ListenPorts reports the pod's listening TCP ports that the policy lets
// the host forward to, waiting for a change when asked to.
func (p *portForward) ListenPorts(ctx context.Context, r *agentapi.ListenPortsRequest) (*agentapi.ListenPortsResponse, error) {
	if err := p.allowed(ctx, "ListenPorts", 0); err != nil {
		return nil, err
	}
	wait := min(time.Duration(r.WaitMs)*time.Millisecond, maxPortWait)
	deadline := time.Now().Add(wait)
	for {
		pid, err := p.podPid()
		if err != nil {
			return nil, err
		}
		ports, err := listeningPorts(p.s.cfg.ProcDir, pid)
		if err != nil {
			return nil, err
		}
		ports = slices.DeleteFunc(ports, func(port uint32) bool { return p.allowed(ctx, "", port) != nil })
		if !r.KnownSet || !slices.Equal(ports, r.Known) || !time.Now().Before(deadline) {
			return &agentapi.ListenPortsResponse{Ports: ports}, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(portPollInterval):
		}
	}
}

// Dial connects to a pod port on the loopback of the pod's network
// namespace.
func (p *portForward) Dial(ctx context.Context, r *agentapi.DialRequest) (*agentapi.DialResponse, error) {
	if r.Port == 0 || r.Port > 65535 {
		return nil, fmt.Errorf("port-forward to port %d: not a TCP port: %w", r.Port, errdefs.ErrInvalidArgument)
	}
	if err := p.allowed(ctx, fmt.Sprintf("port-forward to port %d", r.Port), r.Port); err != nil {
		return nil, err
	}
	// The slot is taken before dialling: a Dial past the limit must not
	// open a connection to the pod's service at all.
	p.mu.Lock()
	if n := len(p.conns) + p.dialing; n >= maxForwardConns {
		p.mu.Unlock()
		return nil, fmt.Errorf("port-forward to port %d: %d connections are open already: %w", r.Port, n, errdefs.ErrResourceExhausted)
	}
	p.dialing++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.dialing--
		p.mu.Unlock()
	}()
	netns, release, err := p.podNetns()
	if err != nil {
		return nil, err
	}
	c, err := dialPod(ctx, netns, r.Port)
	release()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	p.conns[p.next] = newFwdConn(c)
	log.G(ctx).WithField("port", r.Port).WithField("conn", p.next).Debug("port-forward connection open")
	return &agentapi.DialResponse{ConnId: p.next}, nil
}

// podPid is a process in the pod's network namespace: the init of its
// sandbox container (the container whose id is the pod's sandbox id),
// which has the pod's interfaces and which the pod's other containers
// join. 0 without one (a container outside a pod): the agent's own
// namespace, which such containers share.
func (p *portForward) podPid() (int, error) {
	sb, err := p.podSandbox()
	if sb == nil {
		return 0, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.init.pid, nil
}

// podSandbox returns the pod's running sandbox container, or nil without
// one. One whose init has exited is skipped: its pid may name another
// process of the VM now. A pod whose sandboxes all exited (or are still
// being created) is refused, rather than given the agent's namespace.
//
// Under a [policy] the sandbox is the one container the policy admitted
// as the pod's sandbox (policy.Container.PodSandbox), whatever ids the
// host gave, and a pod without it running is refused: the VM's own
// namespace is never the pod's.
func (p *portForward) podSandbox() (*container, error) {
	s := p.s
	governed := s.evaluator().Governs()
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if governed {
		err = fmt.Errorf("port-forward: no sandbox container admitted by the pod's policy runs (the VM's own network namespace is not the pod's): %w", errdefs.ErrFailedPrecondition)
	}
	for id, c := range s.containers {
		c.mu.Lock()
		init, grant, removing := c.init, c.grant, c.removing
		c.mu.Unlock()
		if governed && !grant.PodSandbox() || !governed && c.sandboxID != id {
			continue
		}
		switch {
		case removing:
			// Its init's pid may soon name another process.
			err = fmt.Errorf("port-forward: the pod's sandbox %q is being removed: %w", id, errdefs.ErrFailedPrecondition)
		case init == nil:
			err = fmt.Errorf("port-forward: the pod's sandbox %q is still being created: %w", id, errdefs.ErrUnavailable)
		case init.exited():
			err = fmt.Errorf("port-forward: the pod's sandbox %q has exited: %w", id, errdefs.ErrFailedPrecondition)
		default:
			return c, nil
		}
	}
	return nil, err
}

// podNetns returns the path of the pod's network namespace ("": the
// agent's own, outside a pod) and a func that releases it: a copy of the
// namespace file the sandbox holds (sandboxns.go), so that the namespace
// dialled is the sandbox's even if its init exits meanwhile.
func (p *portForward) podNetns() (string, func(), error) {
	sb, err := p.podSandbox()
	if sb == nil {
		return "", func() {}, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.removing {
		return "", func() {}, fmt.Errorf("port-forward: the pod's sandbox %q is being removed: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	if sb.ns == nil { // not created by this agent (tests)
		return fmt.Sprintf("/proc/%d/ns/net", sb.init.pid), func() {}, nil
	}
	j, err := joinFrom(sb, "port-forward")
	if err != nil {
		return "", func() {}, err
	}
	return j.paths[specs.NetworkNamespace], j.release, nil
}

// dialPod connects to port on the loopback of the network namespace at
// path netns ("": the agent's own), IPv4 first, as containerd does for
// runc pods.
func dialPod(ctx context.Context, netns string, port uint32) (*net.TCPConn, error) {
	var c net.Conn
	dial := func() error {
		var d net.Dialer
		var err4, err6 error
		if c, err4 = d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))); err4 == nil {
			return nil
		}
		if c, err6 = d.DialContext(ctx, "tcp6", net.JoinHostPort("::1", strconv.Itoa(int(port)))); err6 == nil {
			return nil
		}
		return fmt.Errorf("port-forward: nothing in the pod accepts connections on port %d (IPv4: %v; IPv6: %v): %w", port, err4, err6, errdefs.ErrUnavailable)
	}
	var err error
	if netns != "" {
		// The socket is made on a thread in the pod's namespace, and stays
		// there.
		err = netnsdo.Do(netns, dial)
	} else {
		err = dial()
	}
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

func (p *portForward) conn(id uint64) (*fwdConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.conns[id]
	if c == nil {
		return nil, fmt.Errorf("port-forward connection %d: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

// Read returns what the pod sent, blocking until there is some. Its buffer
// is made once data is there, and no larger than what the socket holds.
func (p *portForward) Read(ctx context.Context, r *agentapi.ConnReadRequest) (*agentapi.ConnReadResponse, error) {
	c, err := p.conn(r.ConnId)
	if err != nil {
		return nil, err
	}
	if err := c.takeReadTurn(ctx); err != nil {
		return nil, err
	}
	defer func() { <-c.readTurn }()
	size := int(r.MaxBytes)
	if size == 0 {
		size = defaultReadBytes
	}
	// A cancelled request must not leave a read blocked forever.
	defer deadlineOnDone(ctx, c.SetReadDeadline)()
	avail, err := c.readable()
	if err == nil {
		buf := make([]byte, min(size, maxReadBytes, max(avail, 1)))
		var n int
		n, err = c.TCPConn.Read(buf)
		if n > 0 {
			return &agentapi.ConnReadResponse{Data: buf[:n]}, nil
		}
	}
	if errors.Is(err, io.EOF) {
		return &agentapi.ConnReadResponse{Eof: true}, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("port-forward connection %d: read: %w", r.ConnId, err)
}

// deadlineOnDone sets a deadline in the past with set when ctx ends,
// which ends a read or write blocked on the connection, and returns the
// func that disarms it: once that returns, the deadline is not set, nor
// being set, so the next request on the connection starts clear.
func deadlineOnDone(ctx context.Context, set func(time.Time) error) (disarm func()) {
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		_ = set(time.Unix(1, 0))
	})
	return func() {
		if !stop() {
			<-done
			_ = set(time.Time{})
		}
	}
}

// readable waits until the connection has data, its end or an error to
// report, without a buffer, and returns how many bytes the socket holds.
func (c *fwdConn) readable() (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var avail int
	err = rc.Read(func(fd uintptr) bool {
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil && n > 0 {
			avail = n
			return true
		}
		// Nothing queued: wait, unless the peer closed or the socket
		// failed, which the read itself then reports.
		var b [1]byte
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return !errors.Is(err, unix.EAGAIN)
	})
	return avail, err
}

// Write sends data to the pod, until it is taken or the request ends.
func (p *portForward) Write(ctx context.Context, r *agentapi.ConnWriteRequest) (*agentapi.ConnWriteResponse, error) {
	c, err := p.conn(r.ConnId)
	if err != nil {
		return nil, err
	}
	if len(r.Data) > maxForwardWrite {
		return nil, fmt.Errorf("port-forward connection %d: a write of %d bytes: at most %d at a time: %w", r.ConnId, len(r.Data), maxForwardWrite, errdefs.ErrInvalidArgument)
	}
	if !c.writing.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("port-forward connection %d: a write is in progress already (one at a time): %w", r.ConnId, errdefs.ErrResourceExhausted)
	}
	defer c.writing.Store(false)
	defer deadlineOnDone(ctx, c.SetWriteDeadline)()
	n, err := c.TCPConn.Write(r.Data)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return &agentapi.ConnWriteResponse{Written: uint32(n)}, fmt.Errorf("port-forward connection %d: write: %w", r.ConnId, err)
	}
	return &agentapi.ConnWriteResponse{Written: uint32(n)}, nil
}

// Close closes a connection, or only its write side.
func (p *portForward) Close(ctx context.Context, r *agentapi.ConnCloseRequest) (*agentapi.Empty, error) {
	c, err := p.conn(r.ConnId)
	if err != nil {
		return nil, err
	}
	if r.WriteOnly {
		if err := c.CloseWrite(); err != nil {
			return nil, fmt.Errorf("port-forward connection %d: close its write side: %w", r.ConnId, err)
		}
		return &agentapi.Empty{}, nil
	}
	p.mu.Lock()
	delete(p.conns, r.ConnId)
	p.mu.Unlock()
	_ = c.Close()
	return &agentapi.Empty{}, nil
}

// listeningPorts reads the TCP ports in state LISTEN on a wildcard or
// loopback address in the network namespace of pid (0: the agent's own)
// from procDir's [pid/]net/tcp and net/tcp6, sorted.
func listeningPorts(procDir string, pid int) ([]uint32, error) {
	if procDir == "" {
		procDir = "/proc"
	}
	if pid > 0 {
		procDir = filepath.Join(procDir, strconv.Itoa(pid))
	}
	var ports []uint32
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join(procDir, "net", name))
		if errors.Is(err, os.ErrNotExist) {
			continue // a kernel without IPv6
		}
		if err != nil {
			return nil, fmt.Errorf("read the listening sockets: %w", err)
		}
		got, err := parseListening(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read the listening sockets from %s: %w", f.Name(), err)
		}
		ports = append(ports, got...)
	}
	slices.Sort(ports)
	return slices.Compact(ports), nil
}

// parseListening parses /proc/net/tcp{,6}: "sl local_address rem_address
// st ...", addresses as hex "ADDR:PORT", LISTEN is state 0A.
func parseListening(r io.Reader) ([]uint32, error) {
	var ports []uint32
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		if f[3] != "0A" {
			continue
		}
		addr, portHex, ok := strings.Cut(f[1], ":")
		if !ok {
			return nil, fmt.Errorf("malformed local address %q", f[1])
		}
		port, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil {
			return nil, fmt.Errorf("malformed port in %q: %w", f[1], err)
		}
		if reachableFromLoopback(addr) {
			ports = append(ports, uint32(port))
		}
	}
	return ports, sc.Err()
}

// reachableFromLoopback reports whether a socket bound to addr accepts
// connections to the loopback: the wildcard address, 127.0.0.0/8, ::1 or
// an IPv4-mapped loopback. /proc/net/tcp{,6} print addresses in hex as
// 32-bit words in host byte order; the guest is little-endian (x86-64).
func reachableFromLoopback(addr string) bool {
	switch len(addr) {
	case 8: // 127.0.0.1 is "0100007F"
		return addr == "00000000" || strings.HasSuffix(addr, "7F")
	case 32:
		switch addr {
		case "00000000000000000000000000000000", // ::
			"00000000000000000000000001000000": // ::1
			return true
		}
		// ::ffff:127.x.y.z
		return addr[:16] == "0000000000000000" && addr[16:24] == "FFFF0000" && reachableFromLoopback(addr[24:])
	}
	return false
}
