package podnet

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/c8s-dev/c8s/internal/netnsdo"
	"golang.org/x/sys/unix"
)

// newNetNS creates a named network namespace for the test (removed at
// cleanup) and runs setup inside it. It returns the namespace's path.
func newNetNS(t testing.TB, setup func() error) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	name := fmt.Sprintf("c8stest-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	path, err := netnsdo.Create(name, setup)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netnsdo.Remove(name) })
	return path
}

var podMAC = net.HardwareAddr{0x02, 0xc8, 0x00, 0x00, 0x00, 0x05}

// podNamespaces builds what CNI's bridge plugin leaves: a pod namespace
// with eth0 (a veth, 10.99.0.5/24 and fd99::5/64, MTU 1400, default route
// via 10.99.0.1) whose peer is in a second, "host" namespace with
// 10.99.0.1/24. It returns both paths.
func podNamespaces(t testing.TB) (pod, host string) {
	host = newNetNS(t, func() error { return netlink.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo"}}) })
	hostNS, err := netns.GetFromPath(host)
	if err != nil {
		t.Fatal(err)
	}
	defer hostNS.Close()
	pod = newNetNS(t, func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", HardwareAddr: podMAC, MTU: 1400}, PeerName: "vethhost", PeerNamespace: netlink.NsFd(hostNS)}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, a := range []string{"10.99.0.5/24", "fd99::5/64"} {
			addr, _ := netlink.ParseAddr(a)
			addr.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(eth0, addr); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(eth0); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("10.99.0.1")})
	})
	err = netnsdo.Do(host, func() error {
		l, err := netlink.LinkByName("vethhost")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.99.0.1/24")
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	return pod, host
}

func TestSetupMirrorsEth0ToATap(t *testing.T) {
	pod, host := podNamespaces(t)
	n, err := Setup(pod)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() { n.Close() })

	if len(n.Endpoints) != 1 {
		t.Fatalf("endpoints = %+v, want eth0 only", n.Endpoints)
	}
	ep := n.Endpoints[0]
	if ep.Name != "eth0" || ep.Tap != "tap0"+TapSuffix || ep.MAC.String() != podMAC.String() || ep.MTU != 1400 {
		t.Fatalf("endpoint = %s tap %s MAC %s MTU %d, want eth0 tap0_c8s %s 1400", ep.Name, ep.Tap, ep.MAC, ep.MTU, podMAC)
	}
	req := n.Request()
	if got := req.Interfaces[0].Addresses; !slices.Equal(got, []string{"10.99.0.5/24", "fd99::5/64"}) {
		t.Errorf("addresses = %v, want the global IPv4 and IPv6 ones", got)
	}
	wantRoute := func(dst, gw string, scope uint32) {
		t.Helper()
		for _, r := range req.Routes {
			if r.Destination == dst && r.Gateway == gw && r.Scope == scope && r.Interface == "eth0" {
				return
			}
		}
		t.Errorf("routes %v lack %s via %q scope %d", req.Routes, dst, gw, scope)
	}
	wantRoute("0.0.0.0/0", "10.99.0.1", 0)
	wantRoute("10.99.0.0/24", "", unix.RT_SCOPE_LINK)
	for _, r := range req.Routes {
		if ip, _, _ := net.ParseCIDR(r.Destination); ip.IsLinkLocalUnicast() || ip.IsMulticast() {
			t.Errorf("route %v should be left to the guest kernel", r)
		}
	}
	if nics := n.NICs(); len(nics) != 1 || nics[0].Tap == nil || nics[0].MAC.String() != podMAC.String() {
		t.Fatalf("NICs = %+v", nics)
	}

	// The tap and both redirects exist in the pod namespace.
	err = netnsdo.Do(pod, func() error {
		tap, err := netlink.LinkByName(ep.Tap)
		if err != nil {
			return err
		}
		if tap.Type() != "tuntap" || tap.Attrs().MTU != 1400 || tap.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("tap: type %s MTU %d flags %v", tap.Type(), tap.Attrs().MTU, tap.Attrs().Flags)
		}
		if tt, ok := tap.(*netlink.Tuntap); ok && tt.Flags&netlink.TUNTAP_MULTI_QUEUE != 0 {
			return fmt.Errorf("tap is multi-queue")
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, pair := range [][2]netlink.Link{{eth0, tap}, {tap, eth0}} {
			filters, err := netlink.FilterList(pair[0], netlink.MakeHandle(0xffff, 0))
			if err != nil {
				return err
			}
			if !redirectsTo(filters, pair[1].Attrs().Index) {
				return fmt.Errorf("no mirred redirect from %s to %s in %+v", pair[0].Attrs().Name, pair[1].Attrs().Name, filters)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// A frame sent to the pod IP from the host side arrives on the tap:
	// the ARP request for 10.99.0.5.
	err = netnsdo.Do(host, func() error {
		c, err := net.Dial("udp4", "10.99.0.5:9")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("hello"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitARP(ep.tap, net.ParseIP("10.99.0.5").To4()); err != nil {
		t.Fatal(err)
	}

	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := unwired(pod); err != nil {
		t.Fatalf("after Close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func redirectsTo(filters []netlink.Filter, ifindex int) bool {
	for _, f := range filters {
		u, ok := f.(*netlink.U32)
		if !ok {
			continue
		}
		for _, a := range u.Actions {
			if m, ok := a.(*netlink.MirredAction); ok && m.Ifindex == ifindex && m.MirredAction == netlink.TCA_EGRESS_REDIR {
				return true
			}
		}
	}
	return false
}

// waitARP reads frames from the tap (each after a 10-byte virtio-net
// header) until an ARP request for target arrives.
func waitARP(tap *os.File, target net.IP) error {
	const vnetHdr = 10
	if err := tap.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	buf := make([]byte, 65536)
	for {
		n, err := tap.Read(buf)
		if err != nil {
			return fmt.Errorf("no ARP request for %s arrived on the tap: %w", target, err)
		}
		f := buf[vnetHdr:n]
		if len(f) >= 42 && binary.BigEndian.Uint16(f[12:14]) == unix.ETH_P_ARP && binary.BigEndian.Uint16(f[20:22]) == 1 && net.IP(f[38:42]).Equal(target) {
			return nil
		}
	}
}

func TestSetupWithoutInterfaces(t *testing.T) {
	pod := newNetNS(t, func() error { return nil })
	n, err := Setup(pod)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	if len(n.Endpoints) != 0 || len(n.NICs()) != 0 || len(n.Request().Interfaces) != 0 {
		t.Fatalf("a namespace with only lo gave endpoints %+v", n.Endpoints)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSetupBadNamespace(t *testing.T) {
	_, err := Setup("/nonexistent/netns")
	if err == nil {
		t.Fatal("Setup of a missing namespace succeeded")
	}
}

// BenchmarkSetupClose wires a CNI-like namespace for a VM and undoes it:
// the shim's share of a networked pod's start and stop.
func BenchmarkSetupClose(b *testing.B) {
	pod, _ := podNamespaces(b)
	for b.Loop() {
		n, err := Setup(pod)
		if err != nil {
			b.Fatal(err)
		}
		if err := n.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// A shim that died with its pod wired leaves taps and redirects in the
// pod's namespace (the caller's, with ctr --with-ns, outlives the pod):
// Cleanup, which `shim delete` runs, removes them without the Network,
// and the namespace can be wired again. A namespace never wired keeps
// its qdiscs.
func TestCleanupAfterADeadShim(t *testing.T) {
	pod, _ := podNamespaces(t)
	n, err := Setup(pod)
	if err != nil {
		t.Fatal(err)
	}
	n.ReleaseTaps() // the shim is gone: only the persistent taps are left
	if err := Cleanup(pod); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if err := unwired(pod); err != nil {
		t.Fatalf("after Cleanup: %v", err)
	}
	again, err := Setup(pod)
	if err != nil {
		t.Fatalf("Setup after Cleanup: %v", err)
	}
	again.Close()
	if err := Cleanup(pod); err != nil {
		t.Fatalf("Cleanup of a namespace with nothing left: %v", err)
	}
	if err := Cleanup("/nonexistent/netns"); err != nil {
		t.Fatalf("Cleanup of a namespace that is gone: %v", err)
	}
}

// unwired checks that the namespace at pod has no tap and eth0 no
// ingress qdisc (the redirect to a tap).
func unwired(pod string) error {
	return netnsdo.Do(pod, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if strings.HasSuffix(l.Attrs().Name, TapSuffix) {
				return fmt.Errorf("tap %s is left", l.Attrs().Name)
			}
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		qdiscs, err := netlink.QdiscList(eth0)
		if err != nil {
			return err
		}
		for _, q := range qdiscs {
			if q.Type() == "ingress" {
				return fmt.Errorf("eth0 keeps its ingress qdisc (the redirect to a tap)")
			}
		}
		return nil
	})
}
