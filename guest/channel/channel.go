// Package channel provides the listener the agent serves ttrpc on: the
// virtio-serial port c8s.agent where the VM has one, else vsock port 1024.
//
// A virtio-serial port is a character device, not a socket: there is one
// "connection", it is opened rather than accepted, and the host's shim can
// disconnect and reconnect. The Listener hands out the open port as a
// net.Conn, waits for the host to be connected before doing so, and after
// the server closes a connection (on EOF when the host went away) reopens the
// port for the next shim.
package channel

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"
)

// PortName is the name of the agent's virtio-serial port.
const PortName = "c8s.agent"

// VirtioPort is where udev links the agent's virtio-serial port. The
// initramfs has no udev, so FindPort also looks the port up by name in
// sysfs.
const VirtioPort = "/dev/virtio-ports/" + PortName

// VsockPort is the agent's vsock port.
const VsockPort = 1024

// Listen returns the agent's listener and the channel's name
// ("virtio-serial" or "vsock"), waiting up to wait for the virtio-serial
// port to appear.
func Listen(wait time.Duration) (net.Listener, string, error) {
	deadline := time.Now().Add(wait)
	for {
		if path, ok := FindPort("/", PortName); ok {
			return NewSerialListener(path), "virtio-serial", nil
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	l, err := vsock.Listen(VsockPort, nil)
	if err != nil {
		return nil, "", fmt.Errorf("no virtio-serial port %s and cannot listen on vsock port %d: %w", VirtioPort, VsockPort, err)
	}
	return l, "vsock", nil
}

// FindPort returns the device node of the virtio-serial port called name,
// below the filesystem root root: udev's /dev/virtio-ports/NAME link if
// there is one, else the /dev/vportNpM node whose sysfs name matches.
func FindPort(root, name string) (string, bool) {
	if link := filepath.Join(root, "dev/virtio-ports", name); exists(link) {
		return link, true
	}
	names, _ := filepath.Glob(filepath.Join(root, "sys/class/virtio-ports/*/name"))
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil || strings.TrimSpace(string(data)) != name {
			continue
		}
		dev := filepath.Join(root, "dev", filepath.Base(filepath.Dir(n)))
		if exists(dev) {
			return dev, true
		}
	}
	return "", false
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// SerialListener serves one character device as a sequence of connections.
type SerialListener struct {
	path string
	// free has a token when no connection is open.
	free   chan struct{}
	closed chan struct{}
	once   sync.Once
	// hostPoll is how often the listener checks whether the host is
	// connected while it is not.
	hostPoll time.Duration
}

// NewSerialListener returns a listener for the character device at path.
func NewSerialListener(path string) *SerialListener {
	l := &SerialListener{
		path:     path,
		free:     make(chan struct{}, 1),
		closed:   make(chan struct{}),
		hostPoll: 100 * time.Millisecond,
	}
	l.free <- struct{}{}
	return l
}

// Accept waits until the previous connection is closed and the host side is
// connected, then returns the port as a connection.
func (l *SerialListener) Accept() (net.Conn, error) {
	select {
	case <-l.free:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	for {
		f, err := os.OpenFile(l.path, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			l.free <- struct{}{}
			return nil, fmt.Errorf("open %s: %w", l.path, err)
		}
		ready, err := l.waitForHost(f)
		if ready {
			return &serialConn{File: f, release: func() { l.free <- struct{}{} }}, nil
		}
		f.Close()
		if err != nil {
			l.free <- struct{}{}
			return nil, err
		}
	}
}

// waitForHost polls the port until it has data (a host is connected and
// talking). POLLHUP means no host is connected: keep waiting.
func (l *SerialListener) waitForHost(f *os.File) (bool, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return false, err
	}
	for {
		select {
		case <-l.closed:
			return false, net.ErrClosed
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
			return false, err
		}
		if perr != nil && !errors.Is(perr, unix.EINTR) {
			return false, fmt.Errorf("poll %s: %w", l.path, perr)
		}
		switch {
		case revents&unix.POLLIN != 0:
			return true, nil
		case revents&(unix.POLLHUP|unix.POLLERR) != 0:
			time.Sleep(l.hostPoll)
		}
	}
}

// Close stops Accept. Open connections stay open.
func (l *SerialListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr names the port.
func (l *SerialListener) Addr() net.Addr { return serialAddr(l.path) }

type serialAddr string

func (a serialAddr) Network() string { return "virtio-serial" }
func (a serialAddr) String() string  { return string(a) }

// serialConn is the open port as a net.Conn.
type serialConn struct {
	*os.File
	once    sync.Once
	release func()
}

func (c *serialConn) Read(p []byte) (int, error) {
	n, err := c.File.Read(p)
	// The host going away shows as EOF (or EPIPE on some kernels).
	if errors.Is(err, unix.EPIPE) {
		err = io.EOF
	}
	return n, err
}

func (c *serialConn) Close() error {
	err := c.File.Close()
	c.once.Do(c.release)
	return err
}

func (c *serialConn) LocalAddr() net.Addr  { return serialAddr(c.Name()) }
func (c *serialConn) RemoteAddr() net.Addr { return serialAddr("host") }
