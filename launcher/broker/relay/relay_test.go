package relay

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// guestEnd is the guest's side of the c8s.kbs port: a yamux client.
func guestEnd(t *testing.T, port net.Conn) *yamux.Session {
	t.Helper()
	s, err := yamux.Client(port, MuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Each stream the guest opens reaches the broker as its own connection,
// both ways, and the relay ends with its context.
func TestRelayPipesEachStreamToTheBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }() // echo
		}
	}()
	hostPort, guestPort := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Relay(ctx, hostPort, ln.Addr().String()) }()
	g := guestEnd(t, guestPort)
	for _, msg := range []string{"first", "second"} {
		s, err := g.Open()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		s.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(s, buf); err != nil || string(buf) != msg {
			t.Fatalf("stream %q came back as %q: %v", msg, buf, err)
		}
		s.Close()
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Relay ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Relay did not end with its context")
	}
}

// A broker that cannot be dialled closes the guest's stream; the relay
// goes on serving.
func TestRelayClosesTheStreamOfAnUnreachableBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	hostPort, guestPort := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Relay(ctx, hostPort, addr)
	s, err := guestEnd(t, guestPort).Open()
	if err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(DialTimeout + 5*time.Second))
	if n, err := s.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read %d bytes, %v; want the stream closed (EOF)", n, err)
	}
}
