package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// silentServer listens on the loopback and holds each connection open
// without reading or writing; it counts the connections it accepted.
func silentServer(t *testing.T) (uint32, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	return uint32(l.Addr().(*net.TCPAddr).Port), &accepted
}

// TestMaliciousHostPortForwardPilesUpRequests: the host sends Reads (1 MiB
// each) on connections to a service that never answers, and Writes to one
// that never reads, many at once: the agent, PID 1, would hold a buffer
// for each until the guest's OOM killer took the pod's containers. A
// waiting Read holds no buffer, a second Read on a connection ends the
// first, a second Write while the first blocks is refused, and a Write is
// bounded in size and ends with its request.
func TestMaliciousHostPortForwardPilesUpRequests(t *testing.T) {
	port, _ := silentServer(t)
	s := withPolicy(t, "", fakeProc(t, procNetTCP, ""))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	const conns = 100
	ids := make([]uint64, conns)
	defer func() {
		cancel()
		for _, id := range ids { // ends whatever still blocks
			_, _ = s.forward.Close(context.Background(), &agentapi.ConnCloseRequest{ConnId: id})
		}
		wg.Wait()
	}()
	for i := range ids {
		d, err := s.forward.Dial(ctx, &agentapi.DialRequest{Port: port})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = d.ConnId
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	firstRead := make(chan error, 1)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.forward.Read(ctx, &agentapi.ConnReadRequest{ConnId: id, MaxBytes: 1 << 20})
			if i == 0 {
				firstRead <- err
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // the reads wait for data
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 16<<20 {
		t.Errorf("%d waiting reads of 1 MiB grew the heap by %d MiB", conns, grown>>20)
	}
	// A second read on a connection ends the first (the shim retries a read
	// a migration cut off) rather than waiting beside it.
	short, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	if _, err := s.forward.Read(short, &agentapi.ConnReadRequest{ConnId: ids[0], MaxBytes: 1 << 20}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a second read on a silent connection: %v, want its own deadline", err)
	}
	select {
	case err := <-firstRead:
		if err == nil {
			t.Error("the first read, ended by the second, reported data")
		}
	case <-time.After(time.Second):
		t.Error("a second read left the first one waiting beside it")
	}

	if _, err := s.forward.Write(ctx, &agentapi.ConnWriteRequest{ConnId: ids[1], Data: make([]byte, maxForwardWrite+1)}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a write of more than %d bytes: %v, want invalid argument", maxForwardWrite, err)
	}
	// Fill the socket until a write blocks, then end its request.
	wctx, wcancel := context.WithCancel(ctx)
	blocked := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if _, err := s.forward.Write(wctx, &agentapi.ConnWriteRequest{ConnId: ids[1], Data: make([]byte, maxForwardWrite)}); err != nil {
				blocked <- err
				return
			}
		}
	}()
	fc, err := s.forward.conn(ids[1])
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for stuck := 0; stuck < 10; { // a write in progress for 300 ms: blocked
		if time.Now().After(deadline) {
			t.Fatal("the writes never blocked")
		}
		time.Sleep(30 * time.Millisecond)
		if fc.writing.Load() {
			stuck++
		} else {
			stuck = 0
		}
	}
	if _, err := s.forward.Write(short, &agentapi.ConnWriteRequest{ConnId: ids[1], Data: []byte("x")}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("a second write while one blocks: %v, want resource exhausted", err)
	}
	wcancel()
	select {
	case err := <-blocked:
		if err == nil || wctx.Err() == nil {
			t.Errorf("blocked write ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a blocked write outlived its request")
	}
}

// readable reports how much the socket holds once there is something, so
// that a Read's buffer is no larger than that; at the peer's close it
// returns for the read to see the end.
func TestForwardConnReadable(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Write([]byte("0123456789"))
		time.Sleep(200 * time.Millisecond)
		c.Close()
	}()
	nc, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := newFwdConn(nc.(*net.TCPConn))
	defer c.Close()
	time.Sleep(50 * time.Millisecond)
	if n, err := c.readable(); n != 10 || err != nil {
		t.Fatalf("readable with 10 bytes queued = %d, %v", n, err)
	}
	if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.readable(); n != 0 || err != nil { // waits for the close
		t.Fatalf("readable at the peer's close = %d, %v", n, err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read after readable at the close: %v, want EOF", err)
	}
}

// A request that ends as its Write or Read returns leaves no deadline
// behind: the next request on the connection works.
func TestPortForwardRequestEndLeavesNoDeadline(t *testing.T) {
	port := echoServer(t)
	s := withPolicy(t, "", fakeProc(t, procNetTCP, ""))
	live := context.Background()
	d, err := s.forward.Dial(live, &agentapi.DialRequest{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer s.forward.Close(live, &agentapi.ConnCloseRequest{ConnId: d.ConnId})
	for i := range 50 {
		ended, cancel := context.WithCancel(live)
		cancel() // the request ends as it runs
		_, _ = s.forward.Write(ended, &agentapi.ConnWriteRequest{ConnId: d.ConnId, Data: []byte("x")})
		_, _ = s.forward.Read(ended, &agentapi.ConnReadRequest{ConnId: d.ConnId})
		time.Sleep(time.Millisecond)
		if _, err := s.forward.Write(live, &agentapi.ConnWriteRequest{ConnId: d.ConnId, Data: []byte("y")}); err != nil {
			t.Fatalf("round %d: a write after a request that ended: %v", i, err)
		}
		short, stop := context.WithTimeout(live, 5*time.Second)
		_, err := s.forward.Read(short, &agentapi.ConnReadRequest{ConnId: d.ConnId})
		stop()
		if err != nil {
			t.Fatalf("round %d: a read after a request that ended: %v", i, err)
		}
	}
}
