package policy

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// PodNetwork is the network the host asks the guest to wire with a
// container's create (CreateContainerRequest.network).
type PodNetwork struct {
	Interfaces []Interface
	Routes     []Route
}

// Interface is one NIC of the request.
type Interface struct {
	Name, MAC string
	MTU       uint32
	// Addresses in CIDR notation.
	Addresses []string
}

// Route is one route of the request.
type Route struct {
	Interface, Destination, Gateway, Source string
	// Scope is netlink's RT_SCOPE_*.
	Scope uint32
}

const networkKey = "policy.network"

// Bounds of a request: far above what a CNI plugin configures, they keep
// a create from running netlink calls without end.
const (
	maxAddresses = 64  // per interface
	maxRoutes    = 256 // in all
)

// Route scopes (RT_SCOPE_UNIVERSE, RT_SCOPE_LINK): a pod's routes are one
// or the other; host scope (254) would make the destination local.
const (
	scopeUniverse = 0
	scopeLink     = 253
)

// PodNetwork decides whether the host may wire the pod network n with
// container c's create ([policy.network], policyapi.Network): only the
// pod's sandbox brings the network, and neither its addresses nor its
// routes take over the guest's loopback.
func (e *Evaluator) PodNetwork(c *Container, n *PodNetwork) error {
	if !e.Governs() || n == nil || len(n.Interfaces) == 0 && len(n.Routes) == 0 {
		return nil
	}
	rule := e.p.NetworkOf()
	k := &checker{req: "CreateContainer", key: networkKey}
	if c != nil {
		k.name, k.id = c.Identity.Name, c.ID
		if !c.PodSandbox() {
			d := k.deny("network", fmt.Sprintf("%d interfaces, %d routes", len(n.Interfaces), len(n.Routes)), "", "on the pod's sandbox container only")
			d.Reason = "not the pod's sandbox"
			d.Hint = "the pod network is wired once, into the sandbox's network namespace, which the pod's containers join"
		}
	}
	if max := rule.InterfaceLimit(); len(n.Interfaces) > max {
		d := k.deny("network.interfaces", fmt.Sprintf("%d interfaces", len(n.Interfaces)), networkKey+".max_interfaces", fmt.Sprint(max))
		d.Reason = "too many"
		d.Hint = "a second interface is a second path for the pod's traffic, chosen by the host"
	}
	// nil: any (the section does not list them); Validate checked them.
	var addrs, routes []netip.Prefix
	if rule.Addresses != nil {
		addrs, _ = policyapi.ParsePrefixes(rule.Addresses)
	}
	if rule.Routes != nil {
		routes, _ = policyapi.ParsePrefixes(rule.Routes)
	}
	if len(n.Routes) > maxRoutes {
		k.deny("network.routes", fmt.Sprintf("%d routes", len(n.Routes)), "", fmt.Sprintf("at most %d", maxRoutes)).Reason = "too many"
	}
	names := map[string]bool{}
	macs := map[string]bool{}
	own := map[string][]netip.Addr{} // the addresses of each interface
	for i, ni := range n.Interfaces {
		field := fmt.Sprintf("network.interfaces[%d]", i)
		switch {
		case ni.Name == "lo" || names[ni.Name]:
			d := k.deny(field+".name", fmt.Sprintf("%q", ni.Name), "", "")
			d.Reason = "the guest's loopback, or named twice"
		case !interfaceName(ni.Name):
			d := k.deny(field+".name", fmt.Sprintf("%q", ni.Name), "", "")
			d.Reason = "not a Linux interface name (1 to 15 printable bytes, no '/', ':' or space)"
		}
		names[ni.Name] = true
		switch hw, err := net.ParseMAC(ni.MAC); {
		case err != nil || len(hw) != 6:
			k.deny(field+".mac", fmt.Sprintf("%q", ni.MAC), "", "").Reason = "not an Ethernet MAC address"
		case macs[hw.String()]:
			k.deny(field+".mac", fmt.Sprintf("%q", ni.MAC), "", "").Reason = "named twice"
		default:
			macs[hw.String()] = true
		}
		if min := rule.MTULimit(); ni.MTU < min {
			d := k.deny(field+".mtu", fmt.Sprint(ni.MTU), networkKey+".min_mtu", fmt.Sprintf("≥ %d", min))
			d.Reason = "below the least"
			d.Hint = "a tiny MTU fragments every TLS record the pod sends"
		}
		if len(ni.Addresses) > maxAddresses {
			k.deny(field+".addresses", fmt.Sprintf("%d addresses", len(ni.Addresses)), "", fmt.Sprintf("at most %d", maxAddresses)).Reason = "too many"
			continue
		}
		for j, a := range ni.Addresses {
			k.address(fmt.Sprintf("%s.addresses[%d]", field, j), a, addrs, rule.Addresses)
			if p, err := netip.ParsePrefix(a); err == nil {
				own[ni.Name] = append(own[ni.Name], p.Addr())
			}
		}
	}
	for i, r := range n.Routes {
		field := fmt.Sprintf("network.routes[%d]", i)
		if !names[r.Interface] {
			d := k.deny(field+".interface", fmt.Sprintf("%q", r.Interface), "", quoted(slices.Sorted(maps.Keys(names))))
			d.Reason = "not an interface of the request"
			d.Hint = "a route through lo or another device the host did not wire would take traffic the guest keeps to itself"
		}
		dst, err := netip.ParsePrefix(r.Destination)
		switch {
		case err != nil:
			k.deny(field+".destination", fmt.Sprintf("%q", r.Destination), "", "").Reason = "not a CIDR prefix"
		case dst.Addr().Is4In6():
			// The kernel routes these by their IPv4 address; the checks
			// below would judge them as IPv6.
			k.deny(field+".destination", fmt.Sprintf("%q", r.Destination), "", "").Reason = "an IPv4-mapped IPv6 prefix"
		case policyapi.PrefixWithin(dst.Masked(), policyapi.Loopback):
			d := k.deny(field+".destination", fmt.Sprintf("%q", r.Destination), "", "")
			d.Reason = "in the loopback network"
			d.Hint = "the pod's own loopback traffic (sidecars, port-forward) would leave through the host's interface"
		case routes != nil && !policyapi.PrefixWithin(dst.Masked(), routes):
			k.deny(field+".destination", fmt.Sprintf("%q", r.Destination), networkKey+".routes", strings.Join(rule.Routes, ", "))
		}
		if r.Gateway != "" {
			gw, err := netip.ParseAddr(r.Gateway)
			if err != nil || gw.IsLoopback() || gw.IsUnspecified() || gw.IsMulticast() || gw.Is4In6() {
				d := k.deny(field+".gateway", fmt.Sprintf("%q", r.Gateway), "", "")
				d.Reason = "not a unicast gateway"
			}
		}
		if r.Source != "" {
			src, err := netip.ParseAddr(r.Source)
			if err != nil || !slices.Contains(own[r.Interface], src) || dst.IsValid() && src.Is4() != dst.Addr().Is4() {
				d := k.deny(field+".source", fmt.Sprintf("%q", r.Source), "", quotedAddrs(own[r.Interface]))
				d.Reason = "not an address of the route's interface, of the destination's family"
				d.Hint = "a source the pod does not own (its loopback, say) breaks every connection the route carries"
			}
		}
		if r.Scope != scopeUniverse && r.Scope != scopeLink {
			d := k.deny(field+".scope", fmt.Sprint(r.Scope), "", fmt.Sprintf("%d (universe) or %d (link)", scopeUniverse, scopeLink))
			d.Reason = "not a scope of a pod's route"
		}
	}
	return e.decide(k.ds)
}

// interfaceName reports whether name is one the kernel takes as it is:
// 1 to 15 bytes (IFNAMSIZ), printable, without '/', ':' or a space. A NUL
// would cut it short, so that the policy judged another name than the
// kernel sets.
func interfaceName(name string) bool {
	if name == "" || len(name) > 15 || name == "." || name == ".." {
		return false
	}
	for _, b := range []byte(name) {
		if b <= ' ' || b >= 0x7f || b == '/' || b == ':' {
			return false
		}
	}
	return true
}

func quotedAddrs(as []netip.Addr) string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return quoted(out)
}

// address checks one interface address.
func (k *checker) address(field, a string, allowed []netip.Prefix, written []string) {
	p, err := netip.ParsePrefix(a)
	if err != nil {
		k.deny(field, fmt.Sprintf("%q", a), "", "").Reason = "not an address in CIDR notation"
		return
	}
	ip := p.Addr()
	switch {
	case ip.Is4In6():
		// netlink adds it as the IPv4 address, which the IPv6 prefixes
		// below would have judged.
		k.deny(field, fmt.Sprintf("%q", a), "", "").Reason = "an IPv4-mapped IPv6 address"
	case ip.IsLoopback() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast():
		d := k.deny(field, fmt.Sprintf("%q", a), "", "")
		d.Reason = "a loopback, unspecified, multicast or link-local address"
		d.Hint = "the pod's loopback and link-local addresses are the guest's own"
	case allowed != nil && !policyapi.PrefixWithin(netip.PrefixFrom(ip, ip.BitLen()), allowed):
		k.deny(field, fmt.Sprintf("%q", a), networkKey+".addresses", strings.Join(written, ", "))
	}
}
