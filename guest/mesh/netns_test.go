package mesh

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/internal/netnsdo"
)

// pods is the real thing on the host's kernel: three network namespaces,
// each a pod, and the agent's redirects programmed into them through
// nftables netlink.
//
//	client (10.77.0.1, fd77::1) --veth-- server (10.77.0.2, fd77::2)
//	                                     server (10.78.0.2) --veth-- outsider (10.78.0.3)
//
// The server's second interface is one the host could add: nothing in the
// redirects names interfaces. The outsider has no mesh.
type pods struct {
	client, server, outsider string // namespace paths
	// workload records, per server port, the peers its workload saw.
	mu   sync.Mutex
	seen map[int][]string
}

func newPods(t *testing.T) *pods {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces and nftables")
	}
	p := &pods{seen: map[int][]string{}}
	for _, ns := range []*string{&p.client, &p.server, &p.outsider} {
		name := fmt.Sprintf("c8smesh-%d-%d", os.Getpid(), netnsSeq.Add(1))
		path, err := netnsdo.Create(name, func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			return netlink.LinkSetUp(lo)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { netnsdo.Remove(name) })
		*ns = path
	}
	p.veth(t, p.client, "10.77.0.1/24", "fd77::1/64", p.server, "10.77.0.2/24", "fd77::2/64")
	p.veth(t, p.server, "10.78.0.2/24", "", p.outsider, "10.78.0.3/24", "")
	return p
}

// veth links namespaces a and b with addresses.
func (p *pods) veth(t *testing.T, a, a4, a6, b, b4, b6 string) {
	t.Helper()
	nsFd := func(path string) int {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	n := netnsSeq.Add(1)
	la, lb := fmt.Sprintf("mesh%da", n), fmt.Sprintf("mesh%db", n)
	err := netnsdo.Do(a, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: la}, PeerName: lb, PeerNamespace: netlink.NsFd(nsFd(b))})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, side := range []struct{ ns, link, v4, v6 string }{{a, la, a4, a6}, {b, lb, b4, b6}} {
		if err := netnsdo.Do(side.ns, func() error {
			l, err := netlink.LinkByName(side.link)
			if err != nil {
				return err
			}
			for _, a := range []string{side.v4, side.v6} {
				if a == "" {
					continue
				}
				addr, err := netlink.ParseAddr(a)
				if err != nil {
					return err
				}
				addr.Flags = unix.IFA_F_NODAD
				if err := netlink.AddrAdd(l, addr); err != nil {
					return err
				}
			}
			return netlink.LinkSetUp(l)
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// serve runs an echo workload in ns on addr; it records who connected.
func (p *pods) serve(t *testing.T, ns, addr string, port int) {
	t.Helper()
	var l net.Listener
	if err := netnsdo.Do(ns, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.seen[port] = append(p.seen[port], c.RemoteAddr().(*net.TCPAddr).IP.String())
			p.mu.Unlock()
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					io.WriteString(c, fmt.Sprintf("%d:%s", port, line))
				}
			}()
		}
	}()
}

func (p *pods) peers(port int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen[port]...)
}

// netnsSeq names the tests' namespaces and links.
var netnsSeq atomic.Int32

// tlsClient is a TLS 1.3 client on c, with cert if not nil, that checks
// nothing of the server.
func tlsClient(c net.Conn, cert *Certificate) *tls.Conn {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.TLS}
	}
	return tls.Client(c, cfg)
}

// dialIn connects from ns to addr, with the mesh's mark if marked.
func dialIn(ns, addr string, marked bool) (net.Conn, error) {
	return dialWithin(ns, addr, marked, 5*time.Second)
}

func dialWithin(ns, addr string, marked bool, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netnsdo.Do(ns, func() (err error) {
		d := &net.Dialer{}
		if marked {
			d = Dialer()
		}
		d.Timeout = timeout
		c, err = d.Dial("tcp", addr)
		return err
	})
	return c, err
}

// startProxy runs a proxy in ns as the agent does: listeners and dials
// in the namespace, the redirect installed through netlink there.
func startProxy(t *testing.T, ns string, p *Proxy, cert *Certificate) {
	startProxyRefusing(t, ns, p, cert, false)
}

// startProxyRefusing is startProxy, with Redirect.Refuse refuse.
func startProxyRefusing(t *testing.T, ns string, p *Proxy, cert *Certificate, refuse bool) {
	t.Helper()
	p.Listen = func(network, addr string) (l net.Listener, err error) {
		err = netnsdo.Do(ns, func() error {
			l, err = net.Listen(network, addr)
			return err
		})
		return l, err
	}
	p.Dial = func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = netnsdo.Do(ns, func() error {
			c, err = DialMarked(ctx, network, addr)
			return err
		})
		return c, err
	}
	p.Log = func(msg string, err error) { t.Logf("proxy: %s: %v", msg, err) }
	p.SetCertificate(cert)
	ls, err := p.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	r, err := p.Redirect(ls)
	if err != nil {
		t.Fatal(err)
	}
	r.Refuse = refuse
	f, err := os.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	nft, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Install(nft); err != nil {
		t.Fatal(err)
	}
	// Installing again replaces the table, it does not add to it.
	if err := r.Install(nft); err != nil {
		t.Fatalf("reinstall: %v", err)
	}
	rules, err := nft.GetRules(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}, &nftables.Chain{Name: "inbound"})
	if err != nil {
		t.Fatal(err)
	}
	_, all := r.Rules(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	want := 0
	for _, rule := range all {
		if rule.Chain.Name == "inbound" {
			want++
		}
	}
	if len(rules) != want {
		t.Fatalf("the inbound chain has %d rules after a reinstall, want the %d of one install", len(rules), want)
	}
}

// The transparent mesh on the kernel: the client's workload dials the
// server pod's address and meshed port as it would without a mesh, over
// IPv4 and IPv6; the proxies carry it in mutual TLS (the server's workload
// sees its own proxy on loopback, never the client). Unmeshed ports pass
// untouched. A client outside the mesh, from the server's other interface
// or past its own redirect, is refused on the meshed port, and so is a
// connection straight to the proxy's listener.
func TestTransparentMesh(t *testing.T) {
	p := newPods(t)
	ca := newTestCA(t)
	const meshed, plain = 8080, 8081
	p.serve(t, p.server, fmt.Sprintf(":%d", meshed), meshed)
	p.serve(t, p.server, fmt.Sprintf(":%d", plain), plain)
	// The client pod serves the meshed port itself: its own traffic to
	// itself stays local.
	p.serve(t, p.client, fmt.Sprintf(":%d", meshed), 1)
	server := &Proxy{CA: ca.pool, Inbound: []initdata.MeshInbound{{Port: meshed, Allow: []policy.Pattern{idClient}}}}
	startProxy(t, p.server, server, ca.issue(t, idServer, time.Hour))
	client := &Proxy{CA: ca.pool, Outbound: []initdata.MeshOutbound{{Port: meshed, Peers: []string{"10.77.0.0/24", "fd77::/64"}, Identity: idServer}}}
	startProxy(t, p.client, client, ca.issue(t, idClient, time.Hour))

	talk := func(ns, addr string, marked bool) (string, error) {
		c, err := dialIn(ns, addr, marked)
		if err != nil {
			return "", err
		}
		defer c.Close()
		return roundTrip(c, "hello")
	}
	for _, addr := range []string{"10.77.0.2:8080", "[fd77::2]:8080"} {
		if got, err := talk(p.client, addr, false); err != nil || got != "8080:hello\n" {
			t.Fatalf("the client's workload to %s: %q, %v", addr, got, err)
		}
	}
	if got := p.peers(meshed); len(got) != 2 || got[0] != "127.0.0.1" || got[1] != "127.0.0.1" {
		t.Fatalf("the server's workload saw %v, want its proxy (127.0.0.1) twice", got)
	}
	if got, err := talk(p.client, "10.77.0.2:8081", false); err != nil || got != "8081:hello\n" {
		t.Fatalf("an unmeshed port: %q, %v", got, err)
	}
	if got := p.peers(plain); len(got) != 1 || got[0] != "10.77.0.1" {
		t.Fatalf("the unmeshed port saw %v, want the client directly", got)
	}
	if got, err := talk(p.client, "10.77.0.1:8080", false); err != nil || got != "1:hello\n" {
		t.Fatalf("the client pod to its own meshed port: %q, %v", got, err)
	}

	// Refused on the meshed port: a plaintext client on the server's
	// other interface; one on the client's network whose own pod does
	// not redirect it (marked); a TLS client without a certificate.
	before := len(p.peers(meshed))
	for name, try := range map[string]func() (string, error){
		"outsider, plaintext":          func() (string, error) { return talk(p.outsider, "10.78.0.2:8080", false) },
		"client network, not redirect": func() (string, error) { return talk(p.client, "10.77.0.2:8080", true) },
	} {
		if got, err := try(); err == nil || strings.Contains(got, "hello") {
			t.Fatalf("%s: answered %q", name, got)
		}
	}
	// A TLS client with the client's identity but past the redirect is
	// accepted only because it holds the certificate: identity decides,
	// not the address (the outsider here).
	c, err := dialIn(p.outsider, "10.78.0.2:8080", false)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(tlsClient(c, nil), "hello"); err == nil {
		t.Fatalf("a TLS client without a certificate: %q", got)
	}
	if len(p.peers(meshed)) != before {
		t.Fatalf("the server's workload got a refused client: %v", p.peers(meshed))
	}
	c, err = dialIn(p.outsider, "10.78.0.2:8080", false)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(tlsClient(c, ca.issue(t, idClient, time.Hour)), "hello"); err != nil || got != "8080:hello\n" {
		t.Fatalf("a client holding an allowed certificate: %q, %v", got, err)
	}
}

// A connection straight to the inbound listener's port, which no redirect
// changed, is refused: the listener is no way around the port's checks.
func TestTransparentListenerNotReachable(t *testing.T) {
	p := newPods(t)
	ca := newTestCA(t)
	p.serve(t, p.server, ":8080", 8080)
	server := &Proxy{CA: ca.pool, Inbound: []initdata.MeshInbound{{Port: 8080, Allow: []policy.Pattern{idClient}}}}
	startProxy(t, p.server, server, ca.issue(t, idServer, time.Hour))
	server.mu.Lock()
	port := server.listeners[0].Addr().(*net.TCPAddr).Port
	server.mu.Unlock()
	c, err := dialIn(p.outsider, fmt.Sprintf("10.78.0.2:%d", port), false)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(tlsClient(c, ca.issue(t, idClient, time.Hour)), "hello"); err == nil {
		t.Fatalf("the inbound listener answered a direct connection: %q", got)
	}
	if len(p.peers(8080)) != 0 {
		t.Fatal("the workload got the connection")
	}
}

// With mesh.unmeshed = "refuse" the mesh still carries the meshed port
// (the redirects, the proxies' marked dials and the replies pass), and
// everything else is dropped both ways: a plaintext client of an
// unmeshed port, and the pod's own connection to a host outside the
// mesh.
func TestTransparentMeshRefusesUnmeshed(t *testing.T) {
	p := newPods(t)
	ca := newTestCA(t)
	p.serve(t, p.server, ":8080", 8080)
	p.serve(t, p.server, ":8081", 8081)
	p.serve(t, p.outsider, ":9999", 9999)
	server := &Proxy{CA: ca.pool, Inbound: []initdata.MeshInbound{{Port: 8080, Allow: []policy.Pattern{idClient}}}}
	startProxyRefusing(t, p.server, server, ca.issue(t, idServer, time.Hour), true)
	client := &Proxy{CA: ca.pool, Outbound: []initdata.MeshOutbound{{Port: 8080, Identity: idServer}}}
	startProxyRefusing(t, p.client, client, ca.issue(t, idClient, time.Hour), true)

	c, err := dialIn(p.client, "10.77.0.2:8080", false)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(c, "hello"); err != nil || got != "8080:hello\n" {
		t.Fatalf("the meshed port under refuse: %q, %v", got, err)
	}
	c.Close()
	// Before the server refuses, the outsider reaches its own workload:
	// the drops below are the refusal's.
	if c, err := dialIn(p.outsider, "10.78.0.3:9999", false); err != nil {
		t.Fatalf("the outsider's own port: %v", err)
	} else {
		c.Close()
	}
	for name, try := range map[string]func() error{
		"a plaintext client of an unmeshed port": func() error { return dialClose(p.outsider, "10.78.0.2:8081") },
		"the server pod to a host outside":       func() error { return dialClose(p.server, "10.78.0.3:9999") },
		"the client pod to an unmeshed port":     func() error { return dialClose(p.client, "10.77.0.2:8081") },
	} {
		if err := try(); err == nil {
			t.Errorf("%s: connected", name)
		}
	}
	if got := p.peers(8081); len(got) != 0 {
		t.Fatalf("the unmeshed port saw %v", got)
	}
}

// dialClose connects from ns to addr within 2 s (a dropped SYN is not
// answered) and hangs up.
func dialClose(ns, addr string) error {
	c, err := dialWithin(ns, addr, false, 2*time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// TestMaliciousHostSteersMeshedPortOutsidePeers: the client meshes port
// 8080 on its peers only (the server's network), and lets its other
// traffic pass. The host, which answers the pod's DNS, gives the
// workload another address for its peer: the outsider's, where a
// plaintext server listens on the meshed port. The connection must not
// reach it: the port's traffic goes through the proxy or nowhere. Other
// ports to that address still pass.
func TestMaliciousHostSteersMeshedPortOutsidePeers(t *testing.T) {
	p := newPods(t)
	ca := newTestCA(t)
	p.serve(t, p.outsider, ":8080", 8080)
	p.serve(t, p.outsider, ":8081", 8081)
	// The client pod reaches the outsider through the server pod's
	// namespace, as any routed address.
	p.route(t, p.client, "10.78.0.0/24", "10.77.0.2")
	p.route(t, p.outsider, "10.77.0.0/24", "10.78.0.2")
	client := &Proxy{CA: ca.pool, Outbound: []initdata.MeshOutbound{{Port: 8080, Peers: []string{"10.77.0.0/24"}, Identity: idServer}}}
	startProxy(t, p.client, client, ca.issue(t, idClient, time.Hour))
	if err := dialClose(p.client, "10.78.0.3:8081"); err != nil {
		t.Fatalf("an unmeshed port outside peers: %v", err)
	}
	if err := dialClose(p.client, "10.78.0.3:8080"); err == nil {
		t.Error("the meshed port to an address outside its peers connected in plaintext")
	}
	if got := p.peers(8080); len(got) != 0 {
		t.Fatalf("the plaintext server on the meshed port saw %v", got)
	}
}

// route adds a route to dst via gw in ns, and lets the server's
// namespace forward.
func (p *pods) route(t *testing.T, ns, dst, gw string) {
	t.Helper()
	if err := netnsdo.Do(p.server, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	if err := netnsdo.Do(ns, func() error {
		_, n, err := net.ParseCIDR(dst)
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Dst: n, Gw: net.ParseIP(gw)})
	}); err != nil {
		t.Fatal(err)
	}
}
