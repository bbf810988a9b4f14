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
	return newSerialListener(f, path), nil
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

func newSerialListener(f *os.File, path string) *SerialListener {
	l := &SerialListener{
		path:   path,
		port:   &port{f: f},
		free:   make(chan struct{}, 1),
		closed: make(chan struct{}),
		// While no host is connected the port reports POLLHUP at once,
		// so this is a sleep between polls: it bounds how long a host
		// that (re)connects waits for its first answer, notably the
		// shim re-attesting a VM that migrated to this node.
		hostPoll: 10 * time.Millisecond,
	}
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
	if err := l.waitForData(); err != nil {
		l.free <- struct{}{}
		return nil, err
	}
	l.port.newConnection()
	return &serialConn{port: l.port, name: l.path, release: func() { l.free <- struct{}{} }}, nil
}

// waitForData returns once the port has data for a connection. While no
// host is connected the port polls POLLHUP: keep waiting.
func (l *SerialListener) waitForData() error {
	if l.port.buffered() {
		return nil
	}
	raw, err := l.port.f.SyscallConn()
	if err != nil {
		return err
	}
	for {
		select {
		case <-l.closed:
			return net.ErrClosed
		default:
		}
		var (
			revents int16
			perr    error
		)
		err := raw.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			_, perr = unix.Poll(fds, int(l.hostPoll/time.Millisecond))
			revents = fds[0].Revents
		})
		if err != nil {
			return err
		}
		if perr != nil && !errors.Is(perr, unix.EINTR) {
			return fmt.Errorf("poll %s: %w", l.path, perr)
		}
		switch {
		case revents&unix.POLLIN != 0:
			return nil
		case revents&(unix.POLLHUP|unix.POLLERR) != 0:
			time.Sleep(l.hostPoll)
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
	f *os.File

	mu sync.Mutex // one reader at a time; guards the fields below
	// buf holds bytes read from the device not yet delivered.
	buf []byte
	// inFrame counts the bytes of the current frame not yet delivered.
	inFrame int
	// lastStream is the highest request stream id of the connection.
	lastStream uint32
	// ended is set when the current connection has seen its end.
	ended bool
}

func (p *port) buffered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.buf) > 0
}

func (p *port) newConnection() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFrame, p.lastStream, p.ended = 0, 0, false
	_ = p.f.SetWriteDeadline(time.Time{})
}

// fill reads more bytes from the device. On EOF (the host disconnected) the
// partial data of the vanished host is dropped.
func (p *port) fill() error {
	chunk := make([]byte, 64*1024)
	n, err := p.f.Read(chunk)
	p.buf = append(p.buf, chunk[:n]...)
	if n > 0 {
		return nil
	}
	if err == nil || errors.Is(err, unix.EPIPE) {
		err = io.EOF
	}
	if errors.Is(err, io.EOF) {
		p.buf = nil
	}
	return err
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
		if err := p.fill(); err != nil {
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
		_ = c.port.f.SetWriteDeadline(time.Now())
	}
	return n, err
}

func (c *serialConn) Write(b []byte) (int, error) {
	if c.isClosed() || c.ended.Load() {
		return 0, net.ErrClosed
	}
	return c.port.f.Write(b)
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
func (c *serialConn) SetDeadline(t time.Time) error      { return c.port.f.SetDeadline(t) }
func (c *serialConn) SetReadDeadline(t time.Time) error  { return c.port.f.SetReadDeadline(t) }
func (c *serialConn) SetWriteDeadline(t time.Time) error { return c.port.f.SetWriteDeadline(t) }
