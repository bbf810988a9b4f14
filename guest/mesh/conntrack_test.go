package mesh

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/internal/netnsdo"
)

// linkWith returns the link of ns that holds address ip.
func linkWith(t *testing.T, ns, ip string) netlink.Link {
	t.Helper()
	var found netlink.Link
	if err := netnsdo.Do(ns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
			for _, a := range addrs {
				if a.IP.String() == ip {
					found = l
					return nil
				}
			}
		}
		return fmt.Errorf("no link with %s", ip)
	}); err != nil {
		t.Fatal(err)
	}
	return found
}

func csum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = (s & 0xffff) + s>>16
	}
	return ^uint16(s)
}

// synFrame is an Ethernet frame to the broadcast MAC carrying a TCP SYN
// src:sport -> dst:dport. The pod's TCP stack discards it (not
// PACKET_HOST) without a RST, after conntrack has confirmed its entry.
func synFrame(srcMAC net.HardwareAddr, src, dst net.IP, sport, dport uint16, seq uint32) []byte {
	f := make([]byte, 14+20+20)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], srcMAC)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 40)
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8] = 64
	ip[9] = unix.IPPROTO_TCP
	copy(ip[12:16], src.To4())
	copy(ip[16:20], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], csum(ip))
	tcp := f[34:54]
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	tcp[12] = 5 << 4
	tcp[13] = 0x02 // SYN
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	pseudo := make([]byte, 12+20)
	copy(pseudo[0:4], src.To4())
	copy(pseudo[4:8], dst.To4())
	pseudo[9] = unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(pseudo[10:], 20)
	copy(pseudo[12:], tcp)
	binary.BigEndian.PutUint16(tcp[16:], csum(pseudo))
	return f
}

// floodSYNs sends, from the host's side of the wire (ns, link l), a SYN
// from hostIP:hostPort to podIP at every port of the pod's ephemeral
// range [lo, hi].
func floodSYNs(t *testing.T, ns string, l netlink.Link, hostIP, podIP string, hostPort uint16, lo, hi int) {
	t.Helper()
	if err := netnsdo.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Protocol: htons(unix.ETH_P_IP)}
		for port := lo; port <= hi; port++ {
			fr := synFrame(l.Attrs().HardwareAddr, net.ParseIP(hostIP), net.ParseIP(podIP), hostPort, uint16(port), 0x11111111)
			if err := unix.Sendto(fd, fr, 0, sa); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func portRange(t *testing.T, ns string) (int, int) {
	var lo, hi int
	if err := netnsdo.Do(ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		if err != nil {
			return err
		}
		f := strings.Fields(string(b))
		lo, _ = strconv.Atoi(f[0])
		hi, _ = strconv.Atoi(f[1])
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return lo, hi
}

// The host, on the pod's wire, pre-opens conntrack entries host:8080 ->
// pod:S for every ephemeral port S (a SYN the pod's TCP stack discards
// without answering: L2 broadcast). The workload's later connection to
// host:8080 (the host answered its DNS) is then the "reply" direction of
// an existing entry: not NEW, so the NAT redirect is never consulted, and
// "ct state established" lets it past the drop. Plaintext leaves the pod on
// a meshed port.
func testConntrackBypass(t *testing.T, peers []string, refuse bool) {
	p := newPods(t)
	ca := newTestCA(t)
	p.serve(t, p.server, ":8080", 8080) // the host's plaintext listener
	client := &Proxy{CA: ca.pool, Outbound: []initdata.MeshOutbound{{Port: 8080, Peers: peers, Identity: idServer}}}
	startProxyRefusing(t, p.client, client, ca.issue(t, idClient, time.Hour), refuse)

	// Baseline: the workload's plaintext on the meshed port never reaches
	// the host's plaintext listener (dropped, or carried in TLS which the
	// host cannot answer).
	if c, err := dialWithin(p.client, "10.77.0.2:8080", false, 2*time.Second); err == nil {
		got, err := roundTrip(c, "baseline")
		c.Close()
		if err == nil {
			t.Fatalf("baseline: the host's plaintext listener echoed %q before the attack", got)
		}
	}

	lo, hi := portRange(t, p.client)
	floodSYNs(t, p.server, linkWith(t, p.server, "10.77.0.2"), "10.77.0.2", "10.77.0.1", 8080, lo, hi)

	c, err := dialWithin(p.client, "10.77.0.2:8080", false, 3*time.Second)
	if err != nil {
		t.Logf("after the flood the workload's dial failed: %v (mesh held)", err)
		return
	}
	defer c.Close()
	got, err := roundTrip(c, "plaintext-secret")
	t.Logf("workload's connection after the flood: answered %q, %v", got, err)
	if err == nil && got == "8080:plaintext-secret\n" {
		t.Errorf("the workload's connection on meshed port 8080 reached the host's plaintext listener, which echoed %q", got)
	}
}

// TestMaliciousHostPreopensConntrack: the host cannot take a meshed
// port's traffic past the proxy by pre-opening conntrack entries the
// workload's connection would be the reply of (rules.go, guard-out).
func TestMaliciousHostPreopensConntrack(t *testing.T) {
	for name, c := range map[string]struct {
		peers  []string
		refuse bool
	}{
		"meshed on peers, another address": {peers: []string{"10.99.0.0/24"}},
		"meshed on every address":          {},
		"meshed on peers, the peer's own":  {peers: []string{"10.77.0.0/24"}},
		"unmeshed refused":                 {refuse: true},
	} {
		t.Run(name, func(t *testing.T) { testConntrackBypass(t, c.peers, c.refuse) })
	}
}
