package network

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/internal/netnsdo"
)

// newNetNS creates an empty named network namespace, removed at cleanup.
func newNetNS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	name := fmt.Sprintf("c8sguest-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	path, err := netnsdo.Create(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netnsdo.Remove(name) })
	return path
}

var nicMAC = net.HardwareAddr{0x02, 0xc8, 0, 0, 0, 0x07}

// vmWithNIC is a namespace standing for the VM's root namespace, holding a
// NIC with nicMAC: one end of a veth pair whose other end, up, stays there.
func vmWithNIC(t *testing.T) string {
	vm := newNetNS(t)
	err := netnsdo.Do(vm, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "enp0s3", HardwareAddr: nicMAC}, PeerName: "peer0"}); err != nil {
			return err
		}
		peer, err := netlink.LinkByName("peer0")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(peer)
	})
	if err != nil {
		t.Fatal(err)
	}
	return vm
}

func podRequest() *agentapi.PodNetwork {
	return &agentapi.PodNetwork{
		Interfaces: []*agentapi.NetInterface{{Name: "eth0", Mac: nicMAC.String(), Mtu: 1400, Addresses: []string{"10.99.0.5/24", "fd99::5/64"}}},
		Routes: []*agentapi.NetRoute{
			{Interface: "eth0", Destination: "0.0.0.0/0", Gateway: "10.99.0.1"},
			{Interface: "eth0", Destination: "10.99.0.0/24", Scope: unix.RT_SCOPE_LINK},
			{Interface: "eth0", Destination: "10.200.0.0/16", Gateway: "10.99.0.254"},
			{Interface: "eth0", Destination: "::/0", Gateway: "fd99::1"},
		},
	}
}

func TestConfigureMovesAndConfiguresTheNIC(t *testing.T) {
	vm, pod := vmWithNIC(t), newNetNS(t)
	loaded := 0
	err := netnsdo.Do(vm, func() error {
		return Configure(context.Background(), podRequest(), pod, Options{LoadDriver: func() { loaded++ }})
	})
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	if loaded != 1 {
		t.Errorf("driver loaded %d times, want 1", loaded)
	}
	err = netnsdo.Do(vm, func() error {
		if l, err := netlink.LinkByName("enp0s3"); err == nil {
			return fmt.Errorf("the NIC %s is still in the VM's namespace", l.Attrs().Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = netnsdo.Do(pod, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("no eth0 in the pod namespace: %w", err)
		}
		a := l.Attrs()
		if a.HardwareAddr.String() != nicMAC.String() || a.MTU != 1400 || a.Flags&net.FlagUp == 0 {
			return fmt.Errorf("eth0: MAC %s MTU %d flags %v", a.HardwareAddr, a.MTU, a.Flags)
		}
		// The host's router advertisements give the pod no address or
		// route past the ones it was given (and the policy bounds).
		for _, p := range []string{"eth0/accept_ra", "eth0/autoconf", "default/accept_ra", "default/autoconf"} {
			if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + p); err != nil || strings.TrimSpace(string(b)) != "0" {
				return fmt.Errorf("%s = %q (%v), want 0: router advertisements would add addresses and routes", p, b, err)
			}
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		var got []string
		for _, ad := range addrs {
			got = append(got, ad.IPNet.String())
		}
		for _, want := range []string{"10.99.0.5/24", "fd99::5/64"} {
			if !strings.Contains(strings.Join(got, " "), want) {
				return fmt.Errorf("eth0 addresses %v lack %s", got, want)
			}
		}
		routes, err := netlink.RouteList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		want := map[string]string{"default4": "10.99.0.1", "10.200.0.0/16": "10.99.0.254", "default6": "fd99::1"}
		for _, r := range routes {
			key := "default4"
			if r.Family == netlink.FAMILY_V6 {
				key = "default6"
			}
			if ones, _ := r.Dst.Mask.Size(); r.Dst != nil && ones > 0 {
				key = r.Dst.String()
			}
			if gw, ok := want[key]; ok && r.Gw != nil && r.Gw.String() == gw {
				delete(want, key)
			}
		}
		if len(want) > 0 {
			return fmt.Errorf("routes %v lack %v", routes, want)
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("lo is not up in the pod namespace (%v)", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// A second call (the NIC is already there) changes nothing and fails
	// not.
	err = netnsdo.Do(vm, func() error {
		return Configure(context.Background(), podRequest(), pod, Options{Wait: 100 * time.Millisecond})
	})
	if err == nil || !strings.Contains(err.Error(), "no NIC with MAC") {
		t.Fatalf("second Configure from a VM without the NIC: %v, want it to report the missing NIC", err)
	}
}

func TestConfigureRejectsBadInput(t *testing.T) {
	pod := newNetNS(t)
	cases := map[string]*agentapi.PodNetwork{
		"bad MAC":   {Interfaces: []*agentapi.NetInterface{{Name: "eth0", Mac: "nope"}}},
		"bad name":  {Interfaces: []*agentapi.NetInterface{{Name: "a/b", Mac: nicMAC.String()}}},
		"long name": {Interfaces: []*agentapi.NetInterface{{Name: strings.Repeat("x", 16), Mac: nicMAC.String()}}},
	}
	for name, req := range cases {
		if err := Configure(context.Background(), req, pod, Options{}); err == nil {
			t.Errorf("%s: Configure accepted %v", name, req)
		}
	}
	vm := vmWithNIC(t)
	bad := podRequest()
	bad.Routes = []*agentapi.NetRoute{{Interface: "eth0", Destination: "0.0.0.0/0", Gateway: "not-an-ip"}}
	err := netnsdo.Do(vm, func() error { return Configure(context.Background(), bad, pod, Options{}) })
	if err == nil || !strings.Contains(err.Error(), "bad gateway") {
		t.Fatalf("Configure with a bad gateway: %v", err)
	}
	if err := Configure(context.Background(), &agentapi.PodNetwork{}, "/nonexistent", Options{}); err != nil {
		t.Fatalf("an empty request must do nothing: %v", err)
	}
}
