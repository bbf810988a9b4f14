package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/mesh"
	"github.com/c8s-dev/c8s/internal/netnsdo"
)

// TestMaliciousHostDualStackNameStaysInPodNetns: the host, which answers
// the pod's DNS, gives the registry's name both an IPv4 and an IPv6
// address, loopback ones. Go's dialer races the two families on
// goroutines of their own, on threads outside the pod's network
// namespace: one attempt would reach a listener of the VM's own
// namespace. Every socket of the pull, the name's lookup included, must
// be the pod's: here the pod's namespace listens on neither address, so
// the dial fails.
func TestMaliciousHostDualStackNameStaysInPodNetns(t *testing.T) {
	_, dial := podNetnsWithDNS(t, "c8spull", netip.MustParseAddr("::1"))
	// The VM's own namespace (the test's) listens on both loopbacks.
	l4, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l4.Close()
	port := l4.Addr().(*net.TCPAddr).Port
	l6, err := net.Listen("tcp6", fmt.Sprintf("[::1]:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer l6.Close()
	accepted := make(chan string, 2)
	for _, l := range []net.Listener{l4, l6} {
		go func() {
			if c, err := l.Accept(); err == nil {
				accepted <- c.LocalAddr().String()
				c.Close()
			}
		}()
	}
	c, err := dial("tcp", fmt.Sprintf("registry.test:%d", port))
	if err == nil {
		c.Close()
		t.Fatalf("the pull dialled %s, a listener outside the pod's network namespace", <-accepted)
	}
	select {
	case a := <-accepted:
		t.Fatalf("the VM's own namespace took a pull's connection on %s", a)
	case <-time.After(100 * time.Millisecond):
	}
}

// The pull's sockets are the agent's own, marked so that the pod's mesh
// neither redirects them into its proxy (a meshed port 443) nor, with
// unmeshed = "refuse", drops them: its lookups' too.
func TestPullSocketsCarryMeshMark(t *testing.T) {
	pod, dial := podNetnsWithDNS(t, "c8smark", netip.MustParseAddr("127.0.0.1"))
	l := listenIn(t, pod)
	c, err := dial("tcp4", fmt.Sprintf("registry.test:%d", l.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if mark := socketMark(t, c); mark != mesh.Mark {
		t.Errorf("the pull's socket has mark %#x, want the mesh's %#x (the agent's own)", mark, mesh.Mark)
	}
}

// socketMark is c's SO_MARK.
func socketMark(t *testing.T, c net.Conn) uint32 {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mark int
	var serr error
	if err := raw.Control(func(fd uintptr) { mark, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return uint32(mark)
}

// podNetnsWithDNS makes a pod network namespace with loopback up and the
// host's DNS in it, which answers registry.test with 127.0.0.1 (A) and
// v6 (AAAA), and returns its path and a pull's dialer into it.
func podNetnsWithDNS(t *testing.T, prefix string, v6 netip.Addr) (string, func(network, addr string) (net.Conn, error)) {
	t.Helper()
	name := fmt.Sprintf("%s-%d", prefix, os.Getpid())
	pod, err := netnsdo.Create(name, func() error {
		return netlink.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netnsdo.Remove(name) })
	var dns net.PacketConn
	if err := netnsdo.Do(pod, func() (err error) {
		dns, err = net.ListenPacket("udp4", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dns.Close() })
	go answer(dns, "registry.test.", netip.MustParseAddr("127.0.0.1"), v6)
	old := pullNameserver
	pullNameserver = func(string) string { return dns.LocalAddr().String() }
	t.Cleanup(func() { pullNameserver = old })
	f, err := os.Open(pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return pod, func(network, addr string) (net.Conn, error) { return netnsDialer(f)(ctx, network, addr) }
}

// answer serves DNS on pc: name has the addresses v4 (A) and v6 (AAAA).
func answer(pc net.PacketConn, name string, v4, v6 netip.Addr) {
	buf := make([]byte, 512)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
		b.EnableCompression()
		_ = b.StartQuestions()
		_ = b.Question(q)
		_ = b.StartAnswers()
		rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}
		switch {
		case q.Name.String() != name:
		case q.Type == dnsmessage.TypeA:
			_ = b.AResource(rh, dnsmessage.AResource{A: v4.As4()})
		case q.Type == dnsmessage.TypeAAAA:
			_ = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: v6.As16()})
		}
		if msg, err := b.Finish(); err == nil {
			pc.WriteTo(msg, from)
		}
	}
}

// The mesh CA client's connections are made as a pull's: a URL naming a
// host is looked up with the pod's DNS, in the pod's namespace, and the
// socket carries the mesh's mark (unmeshed = "refuse" drops the rest).
func TestMeshCAClientDialsInPodNetns(t *testing.T) {
	pod, _ := podNetnsWithDNS(t, "c8smca", netip.MustParseAddr("::1"))
	l := listenIn(t, pod)
	f, err := os.Open(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	client := (&Service{}).meshClient(&initdata.Mesh{URL: "https://registry.test"}, nil, nil, f, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "tcp", fmt.Sprintf("registry.test:%d", l.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatalf("the CA's name, answered by the pod's DNS: %v", err)
	}
	defer c.Close()
	if mark := socketMark(t, c); mark != mesh.Mark {
		t.Errorf("the CA client's socket has mark %#x, want the mesh's %#x", mark, mesh.Mark)
	}
}

// listenIn listens on TCP 127.0.0.1 in network namespace ns.
func listenIn(t *testing.T, ns string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := netnsdo.Do(ns, func() (err error) {
		l, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
