package rootfs

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of the backoff between looks for a device that is not there yet.
// The kernel's uevents wake a wait at once; the backoff only catches what
// they miss (no uevent socket, a dropped message), so it starts short and
// stays short.
const (
	minPoll = 2 * time.Millisecond
	maxPoll = 50 * time.Millisecond
)

// deviceEvents wakes a wait for a device that the kernel may just have
// added. What an event says is never read: it only makes the waiter look
// again, at sysfs and devtmpfs, which decide.
type deviceEvents interface {
	// Wait blocks until an event arrives or d has passed.
	Wait(d time.Duration)
	Close() error
}

// newDeviceEvents opens the guest's device events: the kernel's uevents,
// or, where they cannot be had, a plain sleep.
var newDeviceEvents = func() deviceEvents {
	if u, err := openUevents(); err == nil {
		return u
	}
	return sleeper{}
}

// sleeper waits out every Wait.
type sleeper struct{}

func (sleeper) Wait(d time.Duration) { time.Sleep(d) }
func (sleeper) Close() error         { return nil }

// uevents is a socket on the kernel's uevent multicast group
// (NETLINK_KOBJECT_UEVENT, group 1), which announces every device the
// kernel adds, a block device once its capacity is known and its
// devtmpfs node made.
type uevents struct{ fd int }

func openUevents() (*uevents, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &uevents{fd: fd}, nil
}

// Wait polls the socket for up to d and then drains it, so that the next
// Wait blocks until a newer event.
func (u *uevents) Wait(d time.Duration) {
	ms := max(int(d.Milliseconds()), 1)
	fds := []unix.PollFd{{Fd: int32(u.fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, ms); err != nil && !errors.Is(err, unix.EINTR) {
		time.Sleep(d) // never spin on a broken socket
		return
	} else if n == 0 {
		return
	}
	buf := make([]byte, 8192)
	for range 1024 { // bounded: a flood of events still returns
		if _, _, err := unix.Recvfrom(u.fd, buf, unix.MSG_DONTWAIT); errors.Is(err, unix.EAGAIN) {
			return
		}
		// Other errors (ENOBUFS: events were dropped) only mean: look again.
	}
}

func (u *uevents) Close() error { return unix.Close(u.fd) }
