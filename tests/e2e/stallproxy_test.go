package e2e

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
)

// stallProxy stands in front of a destination's `c8s-launcher serve`
// socket and forwards every connection, except that it stalls the agent
// tunnel (POST /v1/vms/<id>/agent) once the source sends on it after the
// upgrade: the re-attestation's first request, which comes only once the
// transfer has completed. Its answer never arrives, so the source's
// re-attestation waits with the guest already running on the
// destination; reattesting is closed then.
type stallProxy struct {
	sock        string
	reattesting chan struct{}
	once        sync.Once
}

func newStallProxy(t *testing.T, dir, target string) *stallProxy {
	t.Helper()
	p := &stallProxy{sock: filepath.Join(dir, "stall.sock"), reattesting: make(chan struct{})}
	l, err := net.Listen("unix", p.sock)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			a, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("unix", target)
			if err != nil {
				a.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, a, b)
			mu.Unlock()
			go p.forward(a, b)
		}
	}()
	return p
}

// forward copies between the source's connection a and the
// destination's b until either ends. On an agent tunnel, whose upgrade
// request is the connection's first write, the source's next bytes (the
// first request on the agent's channel) stall it both ways.
func (p *stallProxy) forward(a, b net.Conn) {
	defer a.Close()
	defer b.Close()
	go io.Copy(a, b)
	buf := make([]byte, 32<<10)
	for first := true; ; first = false {
		n, err := a.Read(buf)
		if n > 0 {
			if first && bytes.HasPrefix(buf[:n], []byte("POST /v1/vms/")) && bytes.Contains(buf[:n], []byte("/agent HTTP/")) {
				if _, err := b.Write(buf[:n]); err != nil {
					return
				}
				p.stall(a, b)
				return
			}
			if _, err := b.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// stall waits for the source's first bytes on an upgraded agent tunnel,
// and from then on forwards nothing: the answer never arrives.
func (p *stallProxy) stall(a, b net.Conn) {
	one := make([]byte, 1)
	if _, err := a.Read(one); err != nil {
		return
	}
	b.(*net.UnixConn).CloseRead() // the destination's answer is dropped
	p.once.Do(func() { close(p.reattesting) })
	io.Copy(io.Discard, a)
}
