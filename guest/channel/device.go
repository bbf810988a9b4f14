package channel

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// errWouldBlock is device.read's answer, without waiting, while a host is
// connected and has sent nothing new.
var errWouldBlock = errors.New("no data yet")

// device is the virtio-serial port's character device as SerialListener
// uses it; tests substitute a fake that plays the kernel's races.
//
// What the guest's virtio_console driver does, and the listener relies on:
// a read returns the buffered data if there is any, else 0 (EOF) while the
// driver believes no host is connected, else it waits (EAGAIN without
// blocking). poll reports POLLHUP while no host is connected, and then also
// POLLIN, data or not. The driver learns of a host's arrival and departure
// from control messages it handles in a workqueue, while data arrives
// through an interrupt: a new host's first bytes can be read while the
// driver still believes no host is connected, and the read after them then
// returns 0 although that host is there and waits for its answer.
type device interface {
	// read reads what the host sent. n > 0: data. n == 0 with a nil
	// error: no host connected and nothing buffered (the kernel's EOF).
	// With wait it waits while a host is connected and nothing is
	// buffered, honouring the read deadline; without, it returns
	// errWouldBlock then. connected reports that the driver was seen
	// with a host connected (it had to wait, or would have).
	read(b []byte, wait bool) (n int, connected bool, err error)
	// poll waits up to timeout for the port to be readable and reports
	// whether it is, and whether no host is connected (hup).
	poll(timeout time.Duration) (readable, hup bool, err error)

	Write(b []byte) (int, error)
	SetDeadline(t time.Time) error
	SetReadDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
}

// fileDevice is the opened port. Go polls it, so reads and writes take
// deadlines.
type fileDevice struct {
	*os.File
	raw  syscall.RawConn
	path string
}

func newFileDevice(f *os.File, path string) (*fileDevice, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("virtio-serial port %s: %w", path, err)
	}
	return &fileDevice{File: f, raw: raw, path: path}, nil
}

func (d *fileDevice) read(b []byte, wait bool) (int, bool, error) {
	var (
		n         int
		rerr      error
		connected bool
	)
	err := d.raw.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Read(int(fd), b)
			if !errors.Is(rerr, unix.EINTR) {
				break
			}
		}
		if errors.Is(rerr, unix.EAGAIN) {
			// The driver only makes a reader wait while a host
			// is connected.
			connected = true
			if wait {
				return false // wait until readable, then again
			}
			rerr = errWouldBlock
		}
		return true
	})
	if err == nil {
		err = rerr
	}
	if n < 0 {
		n = 0
	}
	if err != nil && !errors.Is(err, errWouldBlock) {
		err = fmt.Errorf("read virtio-serial port %s: %w", d.path, err)
	}
	return n, connected, err
}

func (d *fileDevice) poll(timeout time.Duration) (bool, bool, error) {
	var (
		revents int16
		perr    error
	)
	err := d.raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		_, perr = unix.Poll(fds, int(timeout/time.Millisecond))
		revents = fds[0].Revents
	})
	if err == nil && perr != nil && !errors.Is(perr, unix.EINTR) {
		err = perr
	}
	if err != nil {
		return false, false, fmt.Errorf("poll virtio-serial port %s: %w", d.path, err)
	}
	return revents&unix.POLLIN != 0, revents&(unix.POLLHUP|unix.POLLERR) != 0, nil
}
