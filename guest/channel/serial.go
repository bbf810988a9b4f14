package channel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ttrpc frames start with a 10-byte header: payload length (uint32), stream
// id (uint32), message type (uint8), flags (uint8), big endian.
const (
	frameHeaderLen = 10
	frameRequest   = 1
)

// SerialListener serves a virtio-serial port as a sequence of connections,
// one per host connection.
//
// The port stays open for the agent's lifetime: closing it would make the
// kernel discard data the next shim has already sent. A host connection ends
// when the host disconnects (the port reads EOF) or when a new client shows
// up without the disconnect having been seen (a fast reconnect): ttrpc
// clients number their requests with increasing stream ids starting at 1, so
// a request whose stream id does not increase starts a new connection. The
// bytes of that request are kept for the next connection.
//
// The driver can report a host's arrival after its first bytes (see
// device): a connection whose host the driver has not yet reported (or whose
// previous host's departure it has not reported) waits for that report, up
// to hostGrace, before it takes an EOF for the host's departure; otherwise
// the host's first request would be read and its answer dropped with the
// connection. A host that does leave then ends its connection hostGrace
// later; a host that comes meanwhile is still told apart by its stream ids.
type SerialListener struct {
	path string
	port *port
	// free has a token when no connection is being served.
	free   chan struct{}
	closed chan struct{}
	once   sync.Once
	// hostPoll is how often Accept checks for a host while none is
	// connected.
	hostPoll time.Duration
}

// NewSerialListener opens the character device at path.
func NewSerialListener(path string) (*SerialListener, error) {
	f, err := openPort(path)
	if err != nil {
		return nil, err
	}
	dev, err := newFileDevice(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return newSerialListener(dev, path), nil
}

// openPort opens the virtio-serial port's character device for reading and
// writing. Go polls the device, so reads and writes take deadlines.
func openPort(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open virtio-serial port %s: %w", path, err)
	}
	return f, nil
}

// hostGrace bounds how long a connection whose first bytes came before the
// driver reported its host waits for that report (a control message the
// guest handles in a workqueue, late on a loaded guest) before an EOF counts
// as the host's departure.
const hostGrace = 5 * time.Second

func newSerialListener(dev device, path string) *SerialListener {
	l := &SerialListener{
		path:   path,
		port:   &port{dev: dev, hostGrace: hostGrace},
		free:   make(chan struct{}, 1),
		closed: make(chan struct{}),
		// While no host is connected the port reports POLLHUP at once,
		// so this is a sleep between polls: it bounds how long a host
		// that (re)connects waits for its first answer, notably the
		// shim re-attesting a VM that migrated to this node.
		hostPoll: 10 * time.Millisecond,
	}
	l.port.hostPoll = l.hostPoll
	l.free <- struct{}{}
	return l
}

// Accept waits until the previous connection is closed and a host has sent
// something, then returns the next connection.
func (l *SerialListener) Accept() (net.Conn, error) {
	select {
	case <-l.free:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	hostSeen, err := l.waitForData()
	if err != nil {
		l.free <- struct{}{}
		return nil, err
	}
	l.port.newConnection(hostSeen)
	return &serialConn{port: l.port, name: l.path, release: func() { l.free <- struct{}{} }}, nil
}

// waitForData returns once the port has data for a connection, and whether
// the driver has reported its host. While no host is connected the port
// polls readable and POLLHUP at once: a read then tells the first bytes of a
// host the driver has not reported yet from nothing (EOF). Without that
// read, every poll would start a connection that reads EOF at once, a busy
// loop that starves the guest's workqueue, which then reports arriving
// hosts later still.
func (l *SerialListener) waitForData() (hostSeen bool, err error) {
	if l.port.buffered() {
		// A new client's request, which ended the previous connection
		// before the driver reported the old host's departure: the
		// driver's reports of both hosts may still be to come.
		return false, nil
	}
	for {
		select {
		case <-l.closed:
			return false, net.ErrClosed
		default:
		}
		readable, hup, err := l.port.dev.poll(l.hostPoll)
		if err != nil {
			return false, err
		}
		switch {
		case readable && !hup:
			return true, nil
		case readable || hup:
			got, err := l.port.fillNow()
			switch {
			case errors.Is(err, errWouldBlock):
				// The driver has just seen a host arrive.
			case err != nil:
				return false, err
			case got:
				return false, nil
			default:
				time.Sleep(l.hostPoll) // no host
			}
		}
	}
}

// Close stops Accept. The port and a connection being served stay open.
func (l *SerialListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr names the port.
func (l *SerialListener) Addr() net.Addr { return serialAddr(l.path) }

type serialAddr string

func (a serialAddr) Network() string { return "virtio-serial" }
func (a serialAddr) String() string  { return string(a) }

// port is the open device with the framing state of the current connection.
type port struct {
	dev device
	// hostGrace and hostPoll: see SerialListener.
	hostGrace, hostPoll time.Duration

	mu sync.Mutex // one reader at a time; guards the fields below
	// buf holds bytes read from the device not yet delivered.
	buf []byte
	// inFrame counts the bytes of the current frame not yet delivered.
	inFrame int
	// lastStream is the highest request stream id of the connection.
	lastStream uint32
	// ended is set when the current connection has seen its end.
	ended bool
	// hostSeen is set once the driver has reported the current
	// connection's host connected; until then an EOF may only mean that
	// the report is still to come.
	hostSeen bool
	// chunk is the one read buffer (chunkBuf): a port waiting for its
	// host reads every hostPoll, which must not allocate each time.
	chunk []byte
}

// chunkBuf returns the port's read buffer. The caller holds mu.
func (p *port) chunkBuf() []byte {
	if p.chunk == nil {
		p.chunk = make([]byte, 64*1024)
	}
	return p.chunk
}

func (p *port) buffered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.buf) > 0
}

func (p *port) newConnection(hostSeen bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFrame, p.lastStream, p.ended, p.hostSeen = 0, 0, false, hostSeen
	_ = p.dev.SetWriteDeadline(time.Time{})
}

// fillNow reads what the device has without waiting: got reports data,
// errWouldBlock a host connected with nothing sent yet; neither: no host.
func (p *port) fillNow() (got bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	chunk := p.chunkBuf()
	n, _, err := p.dev.read(chunk, false)
	p.buf = append(p.buf, chunk[:n]...)
	return n > 0, err
}

// fill reads more bytes from the device, waiting for them. On EOF (the host
// disconnected) the partial data of the vanished host is dropped.
func (p *port) fill(closed func() bool) error {
	chunk := p.chunkBuf()
	for {
		n, connected, err := p.dev.read(chunk, true)
		if connected {
			p.hostSeen = true
		}
		p.buf = append(p.buf, chunk[:n]...)
		if n > 0 {
			return nil
		}
		if err == nil || errors.Is(err, unix.EPIPE) {
			had := len(p.buf)
			if !p.hostSeen && p.awaitHost(closed) {
				// The host is there: its report was late.
				if len(p.buf) > had {
					return nil
				}
				continue
			}
			err = io.EOF
		}
		if errors.Is(err, io.EOF) {
			p.buf = nil
		}
		return err
	}
}

// awaitHost waits, up to hostGrace, for the driver to report the host of a
// connection that has read bytes the driver delivered before reporting their
// host, and reports whether it did, or delivered more of its bytes.
func (p *port) awaitHost(closed func() bool) bool {
	chunk := p.chunkBuf()
	deadline := time.Now().Add(p.hostGrace)
	for time.Now().Before(deadline) && !closed() {
		time.Sleep(p.hostPoll)
		n, _, err := p.dev.read(chunk, false)
		p.buf = append(p.buf, chunk[:n]...)
		switch {
		case n > 0:
			return true
		case errors.Is(err, errWouldBlock):
			p.hostSeen = true
			return true
		case err != nil:
			return false
		}
	}
	return false
}

// read delivers the current connection's bytes to b.
func (p *port) read(b []byte, closed func() bool) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.ended || closed() {
			return 0, io.EOF
		}
		if p.inFrame > 0 && len(p.buf) > 0 {
			n := copy(b, p.buf[:min(len(p.buf), p.inFrame)])
			p.buf = p.buf[n:]
			p.inFrame -= n
			return n, nil
		}
		if p.inFrame == 0 && len(p.buf) >= frameHeaderLen {
			length := binary.BigEndian.Uint32(p.buf[0:4])
			stream := binary.BigEndian.Uint32(p.buf[4:8])
			if p.buf[8] == frameRequest {
				if p.lastStream != 0 && stream <= p.lastStream {
					// A new client: end this connection, keep the
					// bytes for the next one.
					p.ended = true
					return 0, io.EOF
				}
				p.lastStream = stream
			}
			p.inFrame = frameHeaderLen + int(length)
			continue
		}
		if err := p.fill(closed); err != nil {
			p.ended = true
			return 0, err
		}
	}
}

// serialConn is one host connection over the port.
type serialConn struct {
	port    *port
	name    string
	mu      sync.Mutex
	closed  bool
	release func()
	// ended is set once reads have seen the connection's end; from then on
	// nothing may be written: it would reach the next host.
	ended atomic.Bool
}

func (c *serialConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *serialConn) Read(b []byte) (int, error) {
	n, err := c.port.read(b, c.isClosed)
	if err != nil && !c.ended.Swap(true) {
		// A write blocked on the port (a disconnected host cannot take
		// data) must not complete into the next host's connection.
		_ = c.port.dev.SetWriteDeadline(time.Now())
	}
	return n, err
}

func (c *serialConn) Write(b []byte) (int, error) {
	if c.isClosed() || c.ended.Load() {
		return 0, net.ErrClosed
	}
	return c.port.dev.Write(b)
}

// Close ends the connection; the port stays open for the next one.
func (c *serialConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.release()
	}
	return nil
}

func (c *serialConn) LocalAddr() net.Addr                { return serialAddr(c.name) }
func (c *serialConn) RemoteAddr() net.Addr               { return serialAddr("host") }
func (c *serialConn) SetDeadline(t time.Time) error      { return c.port.dev.SetDeadline(t) }
func (c *serialConn) SetReadDeadline(t time.Time) error  { return c.port.dev.SetReadDeadline(t) }
func (c *serialConn) SetWriteDeadline(t time.Time) error { return c.port.dev.SetWriteDeadline(t) }
