package migrate

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pipeServer is a Client whose every dial reaches serve on the other end
// of a net.Pipe; serve gets the connection and the request read from it.
func pipeServer(t *testing.T, serve func(c net.Conn, r *http.Request)) *Client {
	t.Helper()
	return newClient("pipe", func(ctx context.Context) (net.Conn, error) {
		client, server := net.Pipe()
		go func() {
			defer server.Close()
			r, err := http.ReadRequest(bufio.NewReader(server))
			if err != nil {
				t.Errorf("reading the request: %v", err)
				return
			}
			serve(server, r)
		}()
		return client, nil
	})
}

func answer(c net.Conn, status string, body string) {
	io.WriteString(c, "HTTP/1.1 "+status+"\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
}

// A request goes out as HTTP/1.1 with its JSON body and "Connection:
// close"; the answer's JSON is decoded.
func TestClientRoundTrip(t *testing.T) {
	got := make(chan *http.Request, 1)
	gotBody := make(chan string, 1)
	c := pipeServer(t, func(conn net.Conn, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		gotBody <- string(b)
		answer(conn, "200 OK", `{"id":"vm1","uri":"tcp:10.0.0.2:4444","tls":true}`)
	})
	in, err := c.Incoming(context.Background(), IncomingRequest{ID: "vm1"})
	if err != nil {
		t.Fatal(err)
	}
	if in.ID != "vm1" || in.URI != "tcp:10.0.0.2:4444" || !in.TLS {
		t.Errorf("answer decoded as %+v", in)
	}
	r := <-got
	if r.Method != http.MethodPost || r.URL.Path != "/v1/incoming" || !r.Close || r.ProtoMajor != 1 || r.ProtoMinor != 1 {
		t.Errorf("request %s %s HTTP/%d.%d close=%v, want POST /v1/incoming HTTP/1.1 with Connection: close", r.Method, r.URL.Path, r.ProtoMajor, r.ProtoMinor, r.Close)
	}
	if b := <-gotBody; !strings.Contains(b, `"id":"vm1"`) || r.ContentLength != int64(len(b)) {
		t.Errorf("body %q with Content-Length %d", b, r.ContentLength)
	}
}

// What the destination answers wrong comes back as an error naming the
// destination and the call; a 404 is ErrNotFound.
func TestClientBadAnswers(t *testing.T) {
	for name, tc := range map[string]struct {
		serve    func(c net.Conn)
		want     string
		notFound bool
	}{
		"closed without an answer": {serve: func(net.Conn) {}, want: "destination pipe: GET /v1/node: unexpected EOF"},
		"not HTTP":                 {serve: func(c net.Conn) { io.WriteString(c, "SSH-2.0-OpenSSH\r\n\r\n") }, want: "malformed HTTP"},
		"truncated body": {serve: func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"name\":")
		}, want: "reading the answer: unexpected EOF"},
		"too large": {serve: func(c net.Conn) {
			answer(c, "200 OK", `{"name":"`+strings.Repeat("x", maxAnswer)+`"}`)
		}, want: "larger than 1048576 bytes"},
		"not JSON":              {serve: func(c net.Conn) { answer(c, "200 OK", "<html>") }, want: "decoding the answer to GET /v1/node"},
		"an error":              {serve: func(c net.Conn) { answer(c, "409 Conflict", `{"error":"node busy"}`) }, want: "destination pipe: node busy"},
		"not found":             {serve: func(c net.Conn) { answer(c, "404 Not Found", `{"error":"no VM x"}`) }, want: "no VM x", notFound: true},
		"an error without JSON": {serve: func(c net.Conn) { answer(c, "502 Bad Gateway", "") }, want: "destination pipe: 502 Bad Gateway"},
	} {
		t.Run(name, func(t *testing.T) {
			c := pipeServer(t, func(conn net.Conn, _ *http.Request) { tc.serve(conn) })
			_, err := c.Node(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if errors.Is(err, ErrNotFound) != tc.notFound {
				t.Errorf("errors.Is(%v, ErrNotFound) = %v", err, !tc.notFound)
			}
		})
	}
}

// A Wait blocks until the VM exits; cancelling its context ends it at
// once, with an error that wraps context.Canceled (Remote.follow tells a
// cancelled wait from a lost destination by it), and closes the
// connection.
func TestClientWaitCancelled(t *testing.T) {
	closed := make(chan struct{})
	c := pipeServer(t, func(conn net.Conn, _ *http.Request) {
		io.Copy(io.Discard, conn) // until the client closes
		close(closed)
	})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := c.Wait(ctx, "vm1"); errc <- err }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error %v, want one wrapping context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait still blocked 10 s after its context was cancelled")
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection was not closed")
	}
}

// A dial that fails is reported with the destination, and wraps the
// context's error once that has ended.
func TestClientDialFails(t *testing.T) {
	refused := errors.New("connection refused")
	c := newClient("tls://10.0.0.2:7443", func(ctx context.Context) (net.Conn, error) { return nil, refused })
	if err := c.Delete(context.Background(), "vm1"); !errors.Is(err, refused) || !strings.Contains(err.Error(), "destination tls://10.0.0.2:7443: DELETE /v1/vms/vm1") {
		t.Errorf("error %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Status(ctx, "vm1"); !errors.Is(err, context.Canceled) {
		t.Errorf("with a cancelled context: error %v, want one wrapping context.Canceled", err)
	}
}
