// Package channel provides the listener the agent serves ttrpc on: the
// virtio-serial port c8s.agent where the VM has one, else vsock port 1024.
//
// A virtio-serial port is a character device, not a socket: there is one
// "connection", it is opened rather than accepted, and the host's shim can
// disconnect and reconnect. SerialListener keeps the port open for good and
// hands it out as one net.Conn per host connection (see serial.go).
package channel

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mdlayher/vsock"
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
// port to appear. beforeVsock, when not nil, runs before falling back to
// vsock (the boot code loads the vsock modules there).
func Listen(wait time.Duration, beforeVsock func()) (net.Listener, string, error) {
	deadline := time.Now().Add(wait)
	for {
		if path, ok := FindPort("/", PortName); ok {
			l, err := NewSerialListener(path)
			if err != nil {
				return nil, "", err
			}
			return l, "virtio-serial", nil
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if beforeVsock != nil {
		beforeVsock()
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
