// Package relay carries a pod VM's streams to the key broker its measured
// init data names: the host end of the VM's c8s.kbs port speaks yamux, and
// each stream the guest opens is piped to a new TCP connection to the
// broker. The guest runs TLS through it end to end, so the relay sees
// ciphertext only.
//
// It is apart from launcher/broker, the broker itself, so that the shim,
// which relays for every pod for the pod's whole life, links the relay
// alone and not the broker's verifiers and JOSE code (issue 18).
package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/hashicorp/yamux"
)

// MuxConfig is the yamux configuration both ends of the relay port use.
// Keep-alives are off: under emulation a busy guest may not answer in
// time, and the port has no other way of dying than the VM.
func MuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.LogOutput = io.Discard
	c.StreamOpenTimeout = 30 * time.Second
	return c
}

// DialTimeout bounds each connection to the broker.
const DialTimeout = 10 * time.Second

// Relay carries byte streams from the guest to the key broker at addr,
// the one the pod's measured init data names: the guest opens yamux
// streams on port (the host end of the VM's c8s.kbs port) and each is
// piped to a new TCP connection to addr. Relay returns when ctx ends or
// the port closes; it logs the connections it cannot make to log.G(ctx).
func Relay(ctx context.Context, port net.Conn, addr string) error {
	sess, err := yamux.Server(port, MuxConfig())
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = sess.Close() })
	defer stop()
	defer sess.Close()
	for {
		stream, err := sess.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) || sess.IsClosed() {
				return nil
			}
			return err
		}
		go func() {
			defer stream.Close()
			var d net.Dialer
			dctx, cancel := context.WithTimeout(ctx, DialTimeout)
			conn, err := d.DialContext(dctx, "tcp", addr)
			cancel()
			if err != nil {
				log.G(ctx).WithError(err).Warnf("kbs relay: dial the key broker %s", addr)
				return
			}
			defer conn.Close()
			pipe(stream, conn)
		}()
	}
}

// pipe copies both ways until either side ends.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
}
