package vm

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/mdlayher/vsock"
)

// Agent channel transports, as reported by AgentTransport.
const (
	TransportVirtioSerial = "virtio-serial"
	TransportVsock        = "vsock"
)

// AgentTransport says which channel DialAgent uses: TransportVirtioSerial
// or TransportVsock.
func (v *VM) AgentTransport() string {
	if v.spec.VsockCID != 0 {
		return TransportVsock
	}
	return TransportVirtioSerial
}

// DialAgent connects to the guest agent channel: the virtio-serial port's
// unix socket, or vsock port AgentVsockPort when the VM has vhost-vsock.
//
// The virtio-serial socket accepts one connection at a time; a second
// DialAgent waits in the backlog until the first connection is closed.
// Over vsock, DialAgent retries until the guest agent listens or ctx ends.
func (v *VM) DialAgent(ctx context.Context) (net.Conn, error) {
	select {
	case <-v.done:
		return nil, fmt.Errorf("vm: agent: qemu has exited: %w", v.exitErr)
	default:
	}
	if v.spec.VsockCID == 0 {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", filepath.Join(v.spec.StateDir, AgentSocketName))
		if err != nil {
			return nil, fmt.Errorf("vm: agent channel: %w", err)
		}
		return c, nil
	}
	for {
		c, err := vsock.Dial(v.spec.VsockCID, AgentVsockPort, nil)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("vm: agent vsock %d:%d: %w (last error: %v)", v.spec.VsockCID, AgentVsockPort, ctx.Err(), err)
		case <-v.done:
			return nil, fmt.Errorf("vm: agent: qemu has exited: %w", v.exitErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// DialPort connects to the host side of a backend's extra virtio-serial
// port (tee.Pieces.Ports), such as the sim TEE's attestation port. Like the
// agent's port, it takes one connection at a time.
func (v *VM) DialPort(ctx context.Context, name string) (net.Conn, error) {
	select {
	case <-v.done:
		return nil, fmt.Errorf("vm: port %s: qemu has exited: %w", name, v.exitErr)
	default:
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", portSocket(v.spec.StateDir, name))
	if err != nil {
		return nil, fmt.Errorf("vm: port %s: %w", name, err)
	}
	return c, nil
}
