package kbs

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/hashicorp/yamux"
)

// hostEnd serves one yamux session on conn, echoing every stream.
func hostEnd(t *testing.T, conn net.Conn) *yamux.Session {
	t.Helper()
	sess, err := yamux.Server(conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			s, err := sess.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(s, s); s.Close() }()
		}
	}()
	return sess
}

func TestPortDialerReopensAfterTheHostLeft(t *testing.T) {
	var hosts []*yamux.Session
	d := &PortDialer{Open: func() (net.Conn, error) {
		g, h := net.Pipe()
		hosts = append(hosts, hostEnd(t, h))
		return g, nil
	}}
	t.Cleanup(func() {
		for _, h := range hosts {
			h.Close()
		}
	})
	echo := func() {
		t.Helper()
		c, err := d.DialContext(context.Background(), "tcp", "ignored:443")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("echo = %q, %v", buf, err)
		}
	}
	echo()
	echo()
	if len(hosts) != 1 {
		t.Fatalf("%d sessions for two streams, want one", len(hosts))
	}
	hosts[0].Close() // the host side went away (a restarted shim)
	<-d.sess.CloseChan()
	echo()
	if len(hosts) != 2 {
		t.Fatalf("%d sessions after the host left, want a second one", len(hosts))
	}
}

func TestPortDialerOpenError(t *testing.T) {
	d := &PortDialer{Open: func() (net.Conn, error) { return nil, errors.New("no such port") }}
	if _, err := d.DialContext(context.Background(), "tcp", "x:1"); err == nil {
		t.Fatal("a missing port dialed")
	}
}

func TestPermanent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&Error{Op: "attest", Status: http.StatusUnauthorized}, true},
		{&Error{Op: "resource a/b/c", Status: http.StatusNotFound}, true},
		{fmt.Errorf("wrapped: %w", &Error{Status: http.StatusForbidden}), true},
		{&Error{Op: "auth", Status: http.StatusServiceUnavailable}, false},
		{fmt.Errorf("kbs: auth: %w", x509.UnknownAuthorityError{}), true},
		{fmt.Errorf("kbs: auth: %w", x509.HostnameError{}), true},
		{fmt.Errorf("kbs: auth: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), false},
	} {
		if got := permanent(tc.err); got != tc.want {
			t.Errorf("permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
