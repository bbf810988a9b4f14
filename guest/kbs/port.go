package kbs

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// PortName is the virtio-serial port over which the host relays streams
// to the pod's key broker (launcher/broker Relay on the host end).
const PortName = "c8s.kbs"

// PortDialer opens streams to the key broker over the relay port: one
// yamux session on the port, one stream per connection. The host picks
// the destination from the pod's measured init data; the client's TLS,
// pinned to the broker's certificate, makes any other destination fail.
type PortDialer struct {
	// Open opens the port (guest/channel.DialPort on the port's device).
	Open func() (net.Conn, error)

	mu   sync.Mutex
	sess *yamux.Session
}

// DialContext implements Client.Dial; network and addr are the host's
// business.
func (d *PortDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sess == nil || d.sess.IsClosed() {
		port, err := d.Open()
		if err != nil {
			return nil, fmt.Errorf("kbs: open the relay port %s: %w", PortName, err)
		}
		cfg := yamux.DefaultConfig()
		cfg.EnableKeepAlive = false
		cfg.LogOutput = io.Discard
		cfg.StreamOpenTimeout = 30 * time.Second
		if d.sess, err = yamux.Client(port, cfg); err != nil {
			port.Close()
			return nil, err
		}
	}
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := d.sess.OpenStream()
		ch <- result{s, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("kbs: open a stream on the relay port %s (does the host relay it?): %w", PortName, r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
