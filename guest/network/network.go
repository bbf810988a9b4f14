// Package network configures the pod's network inside the VM. The host
// gives the VM one virtio-net NIC per pod interface, with that interface's
// MAC (shim/podnet); Configure finds each NIC by MAC, moves it into the
// sandbox container's network namespace and gives it the pod interface's
// name, MTU, addresses and routes.
package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/containerd/log"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/internal/netnsdo"
)

// DefaultWait bounds how long Configure waits for a NIC to appear after
// loading the driver: under emulation the PCI probe takes a moment.
const DefaultWait = 20 * time.Second

// Options tune Configure.
type Options struct {
	// LoadDriver loads the virtio-net driver (nil: the NICs must exist).
	LoadDriver func()
	// Wait overrides DefaultWait.
	Wait time.Duration
}

// Configure wires the interfaces of req into the network namespace at
// netnsPath (e.g. /proc/<sandbox pid>/ns/net): each NIC, found by MAC in
// the caller's namespace, is moved there,
// renamed, given its MTU and addresses and brought up; then the routes are
// added, directly connected ones first.
func Configure(ctx context.Context, req *agentapi.PodNetwork, netnsPath string, o Options) error {
	ifs := req.GetInterfaces()
	if len(ifs) == 0 {
		return nil
	}
	macs := make([]net.HardwareAddr, len(ifs))
	for i, ni := range ifs {
		mac, err := net.ParseMAC(ni.GetMac())
		if err != nil {
			return fmt.Errorf("interface %s: bad MAC %q: %w", ni.GetName(), ni.GetMac(), err)
		}
		if err := checkName(ni.GetName()); err != nil {
			return err
		}
		macs[i] = mac
	}
	if o.LoadDriver != nil {
		o.LoadDriver()
	}
	wait := o.Wait
	if wait == 0 {
		wait = DefaultWait
	}
	target, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return fmt.Errorf("open the pod's network namespace %s: %w", netnsPath, err)
	}
	defer target.Close()
	for i, ni := range ifs {
		l, err := waitForMAC(ctx, macs[i], wait)
		if err != nil {
			return fmt.Errorf("interface %s: %w", ni.GetName(), err)
		}
		if err := netlink.LinkSetNsFd(l, int(target)); err != nil {
			return fmt.Errorf("move NIC %s (%s) into the pod's network namespace: %w", l.Attrs().Name, macs[i], err)
		}
	}
	return netnsdo.Do(netnsPath, func() error {
		if err := noRouterAdvertisements("default"); err != nil {
			return err
		}
		if lo, err := netlink.LinkByName("lo"); err == nil {
			if err := netlink.LinkSetUp(lo); err != nil {
				return fmt.Errorf("bring up lo: %w", err)
			}
		}
		for i, ni := range ifs {
			if err := setUp(ni, macs[i]); err != nil {
				return fmt.Errorf("interface %s: %w", ni.GetName(), err)
			}
		}
		if err := addRoutes(req.GetRoutes()); err != nil {
			return err
		}
		log.G(ctx).WithField("interfaces", len(ifs)).WithField("routes", len(req.GetRoutes())).Info("pod network configured")
		return nil
	})
}

// noRouterAdvertisements makes interface dev ("default": any added
// later) of the calling thread's network namespace, the pod's, ignore IPv6
// router advertisements: the host sends them, and SLAAC addresses or
// routes from them would bypass the addresses and routes the agent gives
// the pod, which the measured policy bounds ([policy.network]). Before
// the interface is up. A kernel without IPv6 has nothing to ignore.
func noRouterAdvertisements(dev string) error {
	if _, err := os.Stat("/proc/sys/net/ipv6/conf"); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for _, key := range []string{"accept_ra", "autoconf"} {
		p := "/proc/sys/net/ipv6/conf/" + dev + "/" + key
		if err := os.WriteFile(p, []byte("0"), 0o644); err != nil {
			return fmt.Errorf("ignore router advertisements on %s (%s): %w", dev, p, err)
		}
	}
	return nil
}

func checkName(name string) error {
	if name == "" || len(name) >= unix.IFNAMSIZ || strings.ContainsAny(name, "/ \t\n:") || name == "." || name == ".." {
		return fmt.Errorf("interface name %q is not a valid Linux interface name", name)
	}
	return nil
}

// waitForMAC returns the link with mac in the current namespace, polling
// until it appears (the driver probes asynchronously).
func waitForMAC(ctx context.Context, mac net.HardwareAddr, wait time.Duration) (netlink.Link, error) {
	deadline := time.Now().Add(wait)
	for {
		l, err := findMAC(mac)
		if l != nil || err != nil {
			return l, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no NIC with MAC %s appeared within %s: does the guest image carry virtio_net (images/build.sh MODULES)?", mac, wait)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the NIC with MAC %s: %w", mac, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// setUp configures the NIC with mac in the current namespace as ni.
func setUp(ni *agentapi.NetInterface, mac net.HardwareAddr) error {
	l, err := linkByMAC(mac)
	if err != nil {
		return err
	}
	if l.Attrs().Name != ni.GetName() {
		if err := netlink.LinkSetDown(l); err != nil {
			return fmt.Errorf("bring down %s: %w", l.Attrs().Name, err)
		}
		if err := netlink.LinkSetName(l, ni.GetName()); err != nil {
			return fmt.Errorf("rename %s: %w", l.Attrs().Name, err)
		}
	}
	if err := noRouterAdvertisements(ni.GetName()); err != nil {
		return err
	}
	if mtu := int(ni.GetMtu()); mtu > 0 {
		if err := netlink.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("set MTU %d: %w", mtu, err)
		}
	}
	for _, a := range ni.GetAddresses() {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("bad address %q: %w", a, err)
		}
		// The host side of the pod interface already answered for this
		// address: no duplicate address detection.
		if addr.IP.To4() == nil {
			addr.Flags |= unix.IFA_F_NODAD
		}
		if err := netlink.AddrReplace(l, addr); err != nil {
			return fmt.Errorf("add address %s: %w", a, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bring up: %w", err)
	}
	return nil
}

func linkByMAC(mac net.HardwareAddr) (netlink.Link, error) {
	l, err := findMAC(mac)
	if l == nil && err == nil {
		err = fmt.Errorf("no NIC with MAC %s in the pod's network namespace", mac)
	}
	return l, err
}

// findMAC returns the link with mac in the current namespace, or nil.
func findMAC(mac net.HardwareAddr) (netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	for _, l := range links {
		if l.Attrs().HardwareAddr.String() == mac.String() {
			return l, nil
		}
	}
	return nil, nil
}

// addRoutes adds the routes in the current namespace: directly connected
// ones first, so that gateways are reachable when their routes are added.
// Routes the kernel already made for the addresses are kept.
func addRoutes(routes []*agentapi.NetRoute) error {
	var direct, viaGateway []*agentapi.NetRoute
	for _, r := range routes {
		if r.GetGateway() == "" {
			direct = append(direct, r)
		} else {
			viaGateway = append(viaGateway, r)
		}
	}
	for _, r := range append(direct, viaGateway...) {
		nr, err := route(r)
		if err != nil {
			return err
		}
		if err := netlink.RouteAdd(nr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add route %s via %q dev %s: %w", r.GetDestination(), r.GetGateway(), r.GetInterface(), err)
		}
	}
	return nil
}

func route(r *agentapi.NetRoute) (*netlink.Route, error) {
	l, err := netlink.LinkByName(r.GetInterface())
	if err != nil {
		return nil, fmt.Errorf("route %s: interface %q: %w", r.GetDestination(), r.GetInterface(), err)
	}
	_, dst, err := net.ParseCIDR(r.GetDestination())
	if err != nil {
		return nil, fmt.Errorf("route: bad destination %q: %w", r.GetDestination(), err)
	}
	nr := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Scope: netlink.Scope(r.GetScope())}
	if ones, _ := dst.Mask.Size(); ones == 0 {
		nr.Dst = nil // default route
		nr.Family = netlink.FAMILY_V4
		if dst.IP.To4() == nil {
			nr.Family = netlink.FAMILY_V6
		}
	}
	if g := r.GetGateway(); g != "" {
		if nr.Gw = net.ParseIP(g); nr.Gw == nil {
			return nil, fmt.Errorf("route %s: bad gateway %q", r.GetDestination(), g)
		}
	}
	if s := r.GetSource(); s != "" {
		if nr.Src = net.ParseIP(s); nr.Src == nil {
			return nil, fmt.Errorf("route %s: bad source %q", r.GetDestination(), s)
		}
	}
	return nr, nil
}
