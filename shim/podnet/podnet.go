// Package podnet wires a pod VM to the pod's CNI network namespace, the way
// Kata's "tcfilter" model does: for each Ethernet interface CNI put in the
// namespace (eth0, a veth), it creates a tap device next to it and
// redirects every frame arriving on either one to the other with a tc
// ingress qdisc, a match-all u32 filter and a mirred egress redirect. QEMU
// gets the open tap as a virtio-net NIC with the interface's MAC, and the
// guest agent gives that NIC the interface's addresses, MTU and routes
// (agent PodNetwork). The host side of the pod interface keeps its
// addresses; it only forwards frames.
package podnet

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/internal/netnsdo"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// TapSuffix ends the names of the taps podnet creates (tap0_c8s, …);
// interfaces with it are never mirrored themselves.
const TapSuffix = "_c8s"

// Endpoint is one pod interface mirrored to a tap.
type Endpoint struct {
	// Name, MAC and MTU are the pod interface's (e.g. eth0).
	Name string
	MAC  net.HardwareAddr
	MTU  int
	// Addresses are its global IPv4 and IPv6 addresses.
	Addresses []*net.IPNet
	// Tap is the name of the tap device beside it.
	Tap string

	tap *os.File
}

// Network is a pod network namespace wired for a VM. Close undoes it.
type Network struct {
	// NetNS is the path of the pod's network namespace.
	NetNS     string
	Endpoints []Endpoint
	// Routes are the namespace's main-table routes through the endpoints.
	Routes []*agent.NetRoute
}

// Setup mirrors every Ethernet interface of the network namespace at
// netnsPath to a new tap and reads the interfaces' addresses and routes.
// A namespace with only loopback yields a Network without endpoints. On
// error nothing is left behind.
func Setup(netnsPath string) (_ *Network, retErr error) {
	n := &Network{NetNS: netnsPath}
	defer func() {
		if retErr != nil {
			n.Close()
		}
	}()
	err := inNamespace(netnsPath, func(c *rtnl, links []link) error {
		for _, l := range links {
			if !mirrorable(l) {
				continue
			}
			ep, err := mirror(c, l, fmt.Sprintf("tap%d%s", len(n.Endpoints), TapSuffix))
			if ep != nil {
				n.Endpoints = append(n.Endpoints, *ep)
			}
			if err != nil {
				return fmt.Errorf("interface %s: %w", l.Name, err)
			}
			routes, err := routesOf(c, l)
			if err != nil {
				return fmt.Errorf("interface %s: %w", l.Name, err)
			}
			n.Routes = append(n.Routes, routes...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("wire pod network namespace %s to the VM: %w", netnsPath, err)
	}
	return n, nil
}

// inNamespace runs f in the network namespace at netnsPath with a
// route-netlink connection there and its interfaces.
func inNamespace(netnsPath string, f func(c *rtnl, links []link) error) error {
	return netnsdo.Do(netnsPath, func() error {
		c, err := openRTNL()
		if err != nil {
			return err
		}
		defer c.Close()
		links, err := c.links()
		if err != nil {
			return fmt.Errorf("list the interfaces: %w", err)
		}
		return f(c, links)
	})
}

// mirrorable reports whether Setup mirrors l: an Ethernet interface,
// not loopback, a tun or one of its own taps.
func mirrorable(l link) bool {
	return l.Name != "lo" && !strings.HasSuffix(l.Name, TapSuffix) && len(l.MAC) == 6 && l.Kind != "tun"
}

// mirror creates the tap for l and the tc redirects between them. The
// returned endpoint, even with an error, names what was created.
func mirror(c *rtnl, l link, tapName string) (*Endpoint, error) {
	ep := &Endpoint{Name: l.Name, MAC: l.MAC, MTU: l.MTU}
	addrs, err := c.addrs(l.Index)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, ad := range addrs {
		if ad.Scope != unix.RT_SCOPE_UNIVERSE || ad.IP.IsLinkLocalUnicast() {
			continue
		}
		ep.Addresses = append(ep.Addresses, ad.IPNet)
	}
	// One queue: multi-queue is off.
	tap, err := createTap(tapName)
	if err != nil {
		return nil, fmt.Errorf("create tap %s: %w", tapName, err)
	}
	ep.Tap, ep.tap = tapName, tap
	tapLink, err := c.linkByName(tapName)
	if err != nil {
		return ep, fmt.Errorf("find tap %s: %w", tapName, err)
	}
	if err := c.setMTUUp(tapLink.Index, l.MTU); err != nil {
		return ep, fmt.Errorf("set MTU %d on tap %s and bring it up: %w", l.MTU, tapName, err)
	}
	if err := redirect(c, l, tapLink); err != nil {
		return ep, err
	}
	if err := redirect(c, tapLink, l); err != nil {
		return ep, err
	}
	return ep, nil
}

// redirect sends every frame arriving on from out of to: an ingress qdisc,
// a match-all u32 filter and a mirred egress redirect.
func redirect(c *rtnl, from, to link) error {
	if err := c.addIngress(from.Index); err != nil {
		return fmt.Errorf("add an ingress qdisc to %s: %w", from.Name, err)
	}
	if err := c.addRedirect(from.Index, to.Index); err != nil {
		return fmt.Errorf("redirect %s to %s (tc u32 + mirred): %w", from.Name, to.Name, err)
	}
	return nil
}

// routesOf returns the main-table unicast routes through l, without the
// IPv6 link-local and multicast ones the guest kernel makes itself.
func routesOf(c *rtnl, l link) ([]*agent.NetRoute, error) {
	routes, err := c.routes()
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var out []*agent.NetRoute
	for _, r := range routes {
		if r.OIF != l.Index || r.Table != unix.RT_TABLE_MAIN || r.Type != unix.RTN_UNICAST {
			continue
		}
		dst := r.Dst
		if dst == nil {
			dst = &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
			if r.Family == unix.AF_INET6 {
				dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
			}
		}
		if dst.IP.IsLinkLocalUnicast() || dst.IP.IsMulticast() {
			continue
		}
		nr := &agent.NetRoute{Interface: l.Name, Destination: dst.String(), Scope: uint32(r.Scope)}
		if r.Gw != nil {
			nr.Gateway = r.Gw.String()
		}
		if r.Src != nil {
			nr.Source = r.Src.String()
		}
		out = append(out, nr)
	}
	return out, nil
}

// NICs are the VM's NICs, one per endpoint, in order.
func (n *Network) NICs() []vm.NetDevice {
	var nics []vm.NetDevice
	for _, ep := range n.Endpoints {
		nics = append(nics, vm.NetDevice{MAC: ep.MAC, Tap: ep.tap})
	}
	return nics
}

// Request is what the guest agent needs to configure the NICs.
func (n *Network) Request() *agent.PodNetwork {
	req := &agent.PodNetwork{Routes: slices.Clone(n.Routes)}
	for _, ep := range n.Endpoints {
		ni := &agent.NetInterface{Name: ep.Name, Mac: ep.MAC.String(), Mtu: uint32(ep.MTU)}
		for _, a := range ep.Addresses {
			ni.Addresses = append(ni.Addresses, a.String())
		}
		req.Interfaces = append(req.Interfaces, ni)
	}
	return req
}

// ReleaseTaps closes the shim's copies of the tap files once QEMU holds
// its own; the taps stay (they are persistent) until Close.
func (n *Network) ReleaseTaps() {
	for i := range n.Endpoints {
		if f := n.Endpoints[i].tap; f != nil {
			f.Close()
			n.Endpoints[i].tap = nil
		}
	}
}

// Cleanup undoes Setup in the network namespace at netnsPath without its
// Network, as `shim delete` must after a shim that died: it deletes the
// taps (TapSuffix) and the ingress qdiscs, with their redirects to the
// taps, of the interfaces Setup mirrors. A namespace that is gone, or was
// never wired, has nothing to remove.
func Cleanup(netnsPath string) error {
	if _, err := os.Stat(netnsPath); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return inNamespace(netnsPath, func(c *rtnl, links []link) error {
		var taps, mirrored []link
		for _, l := range links {
			switch {
			case strings.HasSuffix(l.Name, TapSuffix):
				taps = append(taps, l)
			case mirrorable(l):
				mirrored = append(mirrored, l)
			}
		}
		if len(taps) == 0 {
			return nil // not wired (or cleaned up): leave the qdiscs alone
		}
		var errs []error
		for _, l := range mirrored {
			if err := c.delIngress(l.Index); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("remove the ingress qdisc of %s: %w", l.Name, err))
			}
		}
		for _, l := range taps {
			if err := c.delLink(l.Index); err != nil {
				errs = append(errs, fmt.Errorf("delete tap %s: %w", l.Name, err))
			}
		}
		return errors.Join(errs...)
	})
}

// Close removes the taps and the ingress qdiscs of the pod interfaces (the
// taps' go with them). A namespace that is already gone has nothing left to
// remove. It is idempotent.
func (n *Network) Close() error {
	n.ReleaseTaps()
	if len(n.Endpoints) == 0 {
		return nil
	}
	eps := n.Endpoints
	n.Endpoints = nil
	if _, err := os.Stat(n.NetNS); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return netnsdo.Do(n.NetNS, func() error {
		c, err := openRTNL()
		if err != nil {
			return err
		}
		defer c.Close()
		var errs []error
		for _, ep := range eps {
			if l, err := c.linkByName(ep.Name); err == nil {
				if err := c.delIngress(l.Index); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
					errs = append(errs, fmt.Errorf("remove the ingress qdisc of %s: %w", ep.Name, err))
				}
			}
			if ep.Tap == "" {
				continue
			}
			if l, err := c.linkByName(ep.Tap); err == nil {
				if err := c.delLink(l.Index); err != nil {
					errs = append(errs, fmt.Errorf("delete tap %s: %w", ep.Tap, err))
				}
			}
		}
		return errors.Join(errs...)
	})
}
