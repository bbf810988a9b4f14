// Package portfwd carries CRI port-forward (`kubectl port-forward`) into a
// pod VM. containerd serves a pod's PortForward by dialing localhost:PORT
// inside the pod's network namespace on the host; with c8s nothing
// listens there, because the pod runs in its VM. A Forwarder mirrors the
// ports the pod listens on, as the guest agent reports them, as
// listeners on that namespace's loopback, and relays each connection to
// the pod over the agent channel.
//
// The guest decides: the agent reports, and accepts connections to, only
// the ports the pod's measured policy allows (agent_policy.
// allow_port_forward); a pod that allows none gets no listener at all.
package portfwd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/internal/netnsdo"
)

const (
	// watchWait is how long one ListenPorts call waits in the guest for
	// the pod's ports to change.
	watchWait = 30 * time.Second
	// chunk is the most one relay RPC carries.
	chunk = 32 * 1024
	// maxRetry bounds the pause between failed ListenPorts calls.
	maxRetry = 5 * time.Second
)

// Forwarder mirrors a pod's listening ports into its network namespace.
type Forwarder struct {
	netns string
	agent agent.PortForwardService

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	listeners map[uint32][]net.Listener
	conns     map[net.Conn]struct{}
	closed    bool
}

// Start begins mirroring the pod's ports into the network namespace at
// netns (containerd's pod netns), or, with netns "", onto the loopback of
// the caller's own (for a host-network pod, where containerd dials the
// node's localhost). Close stops it.
func Start(ctx context.Context, netns string, pf agent.PortForwardService) *Forwarder {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f := &Forwarder{
		netns: netns, agent: pf, ctx: ctx, cancel: cancel,
		listeners: map[uint32][]net.Listener{}, conns: map[net.Conn]struct{}{},
	}
	f.wg.Add(1)
	go f.watch()
	return f
}

// Ports are the ports that have a listener now, sorted.
func (f *Forwarder) Ports() []uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ports []uint32
	for p := range f.listeners {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	return ports
}

// Close removes every listener, ends every relayed connection and waits
// for the forwarder's goroutines.
func (f *Forwarder) Close() {
	f.mu.Lock()
	f.closed = true
	for port, ls := range f.listeners {
		for _, l := range ls {
			l.Close()
		}
		delete(f.listeners, port)
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.cancel()
	f.wg.Wait()
}

// watch keeps the listeners in step with the ports the agent reports.
func (f *Forwarder) watch() {
	defer f.wg.Done()
	ctx := f.ctx
	var (
		known    []uint32
		knownSet bool
		retry    = 250 * time.Millisecond
	)
	for ctx.Err() == nil {
		r, err := f.agent.ListenPorts(ctx, &agent.ListenPortsRequest{Known: known, KnownSet: knownSet, WaitMs: uint32(watchWait / time.Millisecond)})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			err = errgrpc.ToNative(err)
			if errdefs.IsPermissionDenied(err) {
				log.G(ctx).WithField("netns", f.netns).Infof("port-forward to this pod is off: %v", err)
				return
			}
			// Before the pod's policy is in force (FailedPrecondition) or
			// while the agent is busy: try again.
			log.G(ctx).WithError(err).Debug("port-forward: list the pod's ports")
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(retry*2, maxRetry)
			continue
		}
		retry = 250 * time.Millisecond
		f.reconcile(ctx, r.Ports)
		known, knownSet = r.Ports, true
	}
}

// reconcile opens listeners for new ports and closes those of ports the
// pod no longer listens on.
func (f *Forwarder) reconcile(ctx context.Context, ports []uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	for port, ls := range f.listeners {
		if !slices.Contains(ports, port) {
			for _, l := range ls {
				l.Close()
			}
			delete(f.listeners, port)
		}
	}
	for _, port := range ports {
		if _, ok := f.listeners[port]; ok {
			continue
		}
		ls, err := f.listen(port)
		if err != nil {
			log.G(ctx).WithError(err).WithField("port", port).Warn("port-forward: cannot listen in the pod's network namespace")
			continue
		}
		f.listeners[port] = ls
		for _, l := range ls {
			f.wg.Add(1)
			go f.accept(l, port)
		}
		log.G(ctx).WithField("port", port).Debug("port-forward: pod port mirrored")
	}
}

// listen opens the port on the namespace's IPv4 loopback, and on its IPv6
// loopback where the namespace has one (containerd tries IPv4 first).
func (f *Forwarder) listen(port uint32) ([]net.Listener, error) {
	var ls []net.Listener
	do := func(fn func() error) error { return netnsdo.Do(f.netns, fn) }
	if f.netns == "" {
		do = func(fn func() error) error { return fn() }
	}
	err := do(func() error {
		l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		if err != nil {
			return err
		}
		ls = append(ls, l)
		if l6, err := net.Listen("tcp6", net.JoinHostPort("::1", strconv.Itoa(int(port)))); err == nil {
			ls = append(ls, l6)
		}
		return nil
	})
	return ls, err
}

func (f *Forwarder) accept(l net.Listener, port uint32) {
	defer f.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return // closed
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			c.Close()
			return
		}
		f.conns[c] = struct{}{}
		f.wg.Add(1)
		f.mu.Unlock()
		go f.relay(c.(*net.TCPConn), port)
	}
}

// relay carries one connection to the pod port and back, half-closes
// included.
func (f *Forwarder) relay(c *net.TCPConn, port uint32) {
	defer f.wg.Done()
	ctx := f.ctx
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		c.Close()
	}()
	d, err := f.agent.Dial(ctx, &agent.DialRequest{Port: port})
	if err != nil {
		log.G(ctx).WithError(errgrpc.ToNative(err)).WithField("port", port).Warn("port-forward: the pod refused the connection")
		return
	}
	id := d.ConnId
	var once sync.Once
	closeGuest := func() {
		once.Do(func() {
			// Ends the guest's side, and with it a Read still blocked
			// there.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_, _ = f.agent.Close(cctx, &agent.ConnCloseRequest{ConnId: id})
		})
	}
	defer closeGuest()
	errc := make(chan error, 2)
	go func() { errc <- f.toPod(ctx, c, id) }()
	go func() { errc <- f.fromPod(ctx, c, id) }()
	failed := false
	for range 2 {
		if err := <-errc; err != nil && !failed {
			failed = true
			if ctx.Err() == nil {
				log.G(ctx).WithError(err).WithField("port", port).Debug("port-forward connection ended")
			}
			// End the other direction too: closing the client unblocks
			// toPod, closing the guest's side unblocks fromPod.
			c.Close()
			closeGuest()
		}
	}
}

// toPod copies what the client sends to the pod, then half-closes.
func (f *Forwarder) toPod(ctx context.Context, c *net.TCPConn, id uint64) error {
	buf := make([]byte, chunk)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := f.agent.Write(ctx, &agent.ConnWriteRequest{ConnId: id, Data: buf[:n]}); werr != nil {
				return fmt.Errorf("to the pod: %w", errgrpc.ToNative(werr))
			}
		}
		if errors.Is(err, io.EOF) {
			if _, cerr := f.agent.Close(ctx, &agent.ConnCloseRequest{ConnId: id, WriteOnly: true}); cerr != nil {
				return fmt.Errorf("half-close to the pod: %w", errgrpc.ToNative(cerr))
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// fromPod copies what the pod sends to the client, then half-closes.
func (f *Forwarder) fromPod(ctx context.Context, c *net.TCPConn, id uint64) error {
	for {
		r, err := f.agent.Read(ctx, &agent.ConnReadRequest{ConnId: id, MaxBytes: chunk})
		if err != nil {
			return fmt.Errorf("from the pod: %w", errgrpc.ToNative(err))
		}
		if len(r.Data) > 0 {
			if _, err := c.Write(r.Data); err != nil {
				return err
			}
		}
		if r.Eof {
			return c.CloseWrite()
		}
	}
}
