package channel

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// fakeDriver plays the guest's virtio_console driver (see device): data the
// host sent can be read before the driver reports the host connected; with
// nothing buffered a read returns 0 while no host is reported, else waits;
// poll reports readable and POLLHUP while no host is reported; writes wait
// for a host.
type fakeDriver struct {
	mu   sync.Mutex
	cond *sync.Cond
	data []byte
	host bool // the driver's belief: a host is connected
	out  io.Writer
	// writeDeadline fails writes once passed.
	writeDeadline time.Time
	// eofs counts the reads answered with 0 (no host, nothing buffered).
	eofs int
}

func newFakeDriver(out io.Writer) *fakeDriver {
	d := &fakeDriver{out: out}
	d.cond = sync.NewCond(&d.mu)
	return d
}

// deliver hands bytes the host sent to the driver.
func (d *fakeDriver) deliver(b []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.data = append(d.data, b...)
	d.cond.Broadcast()
}

// deliverAfterDeparture hands bytes a new host sent to the driver together with its
// report of the previous host's departure, before the reader runs.
func (d *fakeDriver) deliverAfterDeparture(b []byte, out io.Writer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.data = append(d.data, b...)
	d.host = false
	d.out = out
	d.cond.Broadcast()
}

// report has the driver handle a host's arrival (true) or departure.
func (d *fakeDriver) report(connected bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.host = connected
	d.cond.Broadcast()
}

func (d *fakeDriver) read(b []byte, wait bool) (int, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	connected := false
	for {
		if len(d.data) > 0 {
			n := copy(b, d.data)
			d.data = d.data[n:]
			return n, connected, nil
		}
		if !d.host {
			d.eofs++
			return 0, connected, nil
		}
		connected = true
		if !wait {
			return 0, true, errWouldBlock
		}
		d.cond.Wait()
	}
}

func (d *fakeDriver) poll(timeout time.Duration) (bool, bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		d.mu.Lock()
		readable, hup := len(d.data) > 0 || !d.host, !d.host
		d.mu.Unlock()
		if readable || hup || time.Now().After(deadline) {
			return readable, hup, nil
		}
		time.Sleep(time.Millisecond)
	}
}

func (d *fakeDriver) Write(b []byte) (int, error) {
	d.mu.Lock()
	for {
		if !d.writeDeadline.IsZero() && !time.Now().Before(d.writeDeadline) {
			d.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		if d.host {
			break
		}
		d.cond.Wait()
	}
	out := d.out
	d.mu.Unlock()
	return out.Write(b)
}

func (d *fakeDriver) SetWriteDeadline(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writeDeadline = t
	d.cond.Broadcast()
	if wait := time.Until(t); !t.IsZero() && wait > 0 {
		time.AfterFunc(wait, func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.cond.Broadcast()
		})
	}
	return nil
}

func (d *fakeDriver) SetDeadline(t time.Time) error   { return d.SetWriteDeadline(t) }
func (d *fakeDriver) SetReadDeadline(time.Time) error { return nil }

// TestSerialHostReportedAfterItsFirstBytes: the driver hands over a new
// host's request before it reports that host connected, so the read after
// the request returns 0. That EOF is not the host leaving: the host waits
// for its answer, which must reach it once the driver reports it (CI saw
// TestAgentInVM's GetInfo after a slow reconnect time out this way).
func TestSerialHostReportedAfterItsFirstBytes(t *testing.T) {
	hostEnd, guestEnd := net.Pipe()
	t.Cleanup(func() { hostEnd.Close(); guestEnd.Close() })
	drv := newFakeDriver(guestEnd)
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := guestEnd.Read(b)
			if n > 0 {
				drv.deliver(b[:n]) // the host's bytes, its arrival not yet reported
			}
			if err != nil {
				return
			}
		}
	}()
	l := newSerialListener(drv, "test-port")
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	agentapi.RegisterAgentService(srv, infoOnly{})
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { srv.Close() })

	client := ttrpc.NewClient(hostEnd)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		_, err := agentapi.NewAgentClient(client).GetInfo(ctx, &agentapi.GetInfoRequest{})
		answered <- err
	}()
	// The request has been read and the next read answered EOF before
	// the driver handles the host's arrival.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(time.Millisecond) {
		drv.mu.Lock()
		eofs, pending := drv.eofs, len(drv.data)
		drv.mu.Unlock()
		if eofs > 0 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent never read the request and the EOF after it (%d EOFs, %d bytes pending)", eofs, pending)
		}
	}
	time.Sleep(50 * time.Millisecond)
	drv.report(true)
	if err := <-answered; err != nil {
		t.Fatalf("GetInfo from a host the driver reported after its request: %v", err)
	}
	// The same connection serves the host's next request.
	if _, err := agentapi.NewAgentClient(client).GetInfo(ctx, &agentapi.GetInfoRequest{}); err != nil {
		t.Fatalf("second GetInfo: %v", err)
	}
}

// TestSerialNoHostNoConnection: while no host is connected the port polls
// readable and POLLHUP at once. That is no connection: Accept waits (a
// connection per poll that reads EOF at once is a busy loop that starves the
// guest, and with it the driver's report of the next host).
func TestSerialNoHostNoConnection(t *testing.T) {
	drv := newFakeDriver(io.Discard)
	l := newSerialListener(drv, "test-port")
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	select {
	case <-accepted:
		t.Fatal("Accept returned a connection while no host was connected and nothing was sent")
	case <-time.After(300 * time.Millisecond):
	}
	drv.mu.Lock()
	eofs := drv.eofs
	drv.mu.Unlock()
	// One read per hostPoll (10 ms) at most, with slack for a loaded
	// machine; the busy loop makes thousands.
	if eofs > 60 {
		t.Errorf("%d reads in 300ms while no host was connected: Accept spins", eofs)
	}
	frame := frame(1, frameRequest, "hello")
	drv.deliver(frame) // a host's first bytes, not yet reported
	var c net.Conn
	select {
	case c = <-accepted:
	case <-time.After(3 * time.Second):
		t.Fatal("Accept did not return once a host had sent a request")
	}
	if c == nil {
		t.Fatal("Accept failed")
	}
	got := make([]byte, len(frame))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(frame) {
		t.Fatalf("connection read %q, %v; want the host's request", got, err)
	}
	c.Close()
	l.Close()
}

// pipeHost is a host end of the port: what the returned conn writes reaches
// the guest through deliver.
func pipeHost(t *testing.T, deliver func([]byte)) (host, guest net.Conn) {
	host, guest = net.Pipe()
	t.Cleanup(func() { host.Close(); guest.Close() })
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := guest.Read(b)
			if n > 0 {
				deliver(b[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return host, guest
}

// TestSerialFastReconnectLateReports: a new host's request reaches the old
// connection (ending it: a new client) before the driver handles its report
// of the old host's departure and of the new host's arrival. The read after
// the request then returns 0 for a moment; the new host's answer must
// still reach it.
func TestSerialFastReconnectLateReports(t *testing.T) {
	drv := newFakeDriver(nil)
	drv.report(true)
	host1, guest1 := pipeHost(t, drv.deliver)
	drv.out = guest1
	l := newSerialListener(drv, "test-port")
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	agentapi.RegisterAgentService(srv, infoOnly{})
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	client1 := ttrpc.NewClient(host1)
	if _, err := agentapi.NewAgentClient(client1).GetInfo(ctx, &agentapi.GetInfoRequest{}); err != nil {
		t.Fatalf("first host's GetInfo: %v", err)
	}
	client1.Close()

	// The second host: its bytes come with the first host's departure.
	var host2, guest2 net.Conn
	host2, guest2 = pipeHost(t, func(b []byte) { drv.deliverAfterDeparture(b, guest2) })
	client2 := ttrpc.NewClient(host2)
	defer client2.Close()
	answered := make(chan error, 1)
	go func() {
		_, err := agentapi.NewAgentClient(client2).GetInfo(ctx, &agentapi.GetInfoRequest{})
		answered <- err
	}()
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(time.Millisecond) {
		drv.mu.Lock()
		eofs, pending := drv.eofs, len(drv.data)
		drv.mu.Unlock()
		if eofs > 0 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent never read the second host's request and the EOF after it (%d EOFs, %d bytes pending)", eofs, pending)
		}
	}
	time.Sleep(50 * time.Millisecond)
	drv.report(true) // the second host's arrival
	if err := <-answered; err != nil {
		t.Fatalf("second host's GetInfo: %v", err)
	}
}

// TestSerialWaitingForAHostDoesNotAllocate: while no host is connected the
// listener looks every hostPoll; a look must not allocate (a 64 KiB buffer
// each time was about 6 MB/s of garbage in the guest).
func TestSerialWaitingForAHostDoesNotAllocate(t *testing.T) {
	p := &port{dev: newFakeDriver(io.Discard)}
	p.fillNow() // the first look makes the port's buffer
	if allocs := testing.AllocsPerRun(100, func() {
		if got, err := p.fillNow(); got || err != nil {
			t.Fatalf("a look with no host: got %v, err %v", got, err)
		}
	}); allocs != 0 {
		t.Errorf("a look with no host allocates %.0f times", allocs)
	}
}
