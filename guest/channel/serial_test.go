package channel

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// hostPair returns a SerialListener over one end of a socket pair (standing
// in for the virtio-serial port: EOF when the host side closes) and the
// host's end.
func hostPair(t *testing.T) (*SerialListener, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Non-blocking, so the file is pollable and takes deadlines, as the
	// opened port is.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	guest := os.NewFile(uintptr(fds[0]), "guest")
	host := os.NewFile(uintptr(fds[1]), "host")
	t.Cleanup(func() { guest.Close(); host.Close() })
	dev, err := newFileDevice(guest, "test-port")
	if err != nil {
		t.Fatal(err)
	}
	return newSerialListener(dev, "test-port"), host
}

func frame(stream uint32, typ byte, payload string) []byte {
	h := make([]byte, frameHeaderLen)
	binary.BigEndian.PutUint32(h[0:4], uint32(len(payload)))
	binary.BigEndian.PutUint32(h[4:8], stream)
	h[8] = typ
	return append(h, payload...)
}

// readConn reads a connection to EOF in small pieces.
func readConn(t *testing.T, c net.Conn) []byte {
	t.Helper()
	var out bytes.Buffer
	b := make([]byte, 3)
	for {
		n, err := c.Read(b)
		out.Write(b[:n])
		if err == io.EOF {
			return out.Bytes()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestSerialNewClientStartsNewConnection(t *testing.T) {
	l, host := hostPair(t)
	// The second client leaves without the socket pair ever reporting it
	// connected: its connection ends once hostGrace has passed.
	l.port.hostGrace = 50 * time.Millisecond
	first := append(frame(1, frameRequest, "a"), frame(3, frameRequest, "bb")...)
	first = append(first, frame(1, 3, "data on stream 1")...) // data, not a new request
	second := frame(1, frameRequest, "ccc")
	if _, err := host.Write(append(append([]byte{}, first...), second...)); err != nil {
		t.Fatal(err)
	}
	c1, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if got := readConn(t, c1); !bytes.Equal(got, first) {
		t.Fatalf("first connection got %q, want %q", got, first)
	}
	if _, err := c1.Write([]byte("stale response")); err == nil {
		t.Error("a connection that has ended still writes to the port (the new client would read it)")
	}
	c1.Close()
	c2, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Write([]byte("reply")); err != nil {
		t.Fatalf("the new connection cannot write: %v", err)
	}
	reply := make([]byte, 5)
	if _, err := io.ReadFull(host, reply); err != nil || string(reply) != "reply" {
		t.Fatalf("host read %q, %v; want only the new connection's reply", reply, err)
	}
	host.Close() // the second client goes away after its request
	if got := readConn(t, c2); !bytes.Equal(got, second) {
		t.Fatalf("second connection got %q, want %q", got, second)
	}
}

// TestSerialHostDisconnectEndsConnection: a host that sent and left before
// the guest took its bytes (a socket pair never reports a host: the
// connection ends once hostGrace has passed).
func TestSerialHostDisconnectEndsConnection(t *testing.T) {
	l, host := hostPair(t)
	l.port.hostGrace = 50 * time.Millisecond
	whole := frame(1, frameRequest, "whole")
	partial := frame(3, frameRequest, "partial")[:5] // not even a header
	if _, err := host.Write(append(append([]byte{}, whole...), partial...)); err != nil {
		t.Fatal(err)
	}
	host.Close()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if got := readConn(t, c); !bytes.Equal(got, whole) {
		t.Fatalf("got %q, want the whole frame %q only", got, whole)
	}
	if l.port.buffered() {
		t.Error("the vanished host's partial frame is still buffered")
	}
}

type infoOnly struct {
	agentapi.AgentService
}

func (infoOnly) GetInfo(context.Context, *agentapi.GetInfoRequest) (*agentapi.GetInfoResponse, error) {
	return &agentapi.GetInfoResponse{Channel: "virtio-serial"}, nil
}

// TestSerialServesTTRPC serves a real ttrpc server on the listener.
func TestSerialServesTTRPC(t *testing.T) {
	l, host := hostPair(t)
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	agentapi.RegisterAgentService(srv, infoOnly{})
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { srv.Close() })
	conn, err := net.FileConn(host)
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	for i := 0; i < 3; i++ {
		info, err := agentapi.NewAgentClient(client).GetInfo(context.Background(), &agentapi.GetInfoRequest{})
		if err != nil || info.GetChannel() != "virtio-serial" {
			t.Fatalf("GetInfo %d: %v, %v", i, info, err)
		}
	}
}
