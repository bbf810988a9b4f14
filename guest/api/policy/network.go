package policy

import (
	"errors"
	"fmt"
	"net/netip"
)

// Network is the [policy.network] section: what the host may wire the
// pod VM to. The host mirrors the pod's CNI interface to a NIC of the VM
// and sends its addresses and routes with the pod's sandbox container
// (CreateContainerRequest.network); it owns the wire, so it can always
// drop, delay or redirect the pod's packets, and TLS (to the owner's
// broker, between workloads) is what protects them. What it must not do
// is reconfigure the guest's own stack:
//
//	[policy.network]
//	max_interfaces = 1                        # NICs (default 1)
//	min_mtu = 1280                            # default 1280, IPv6's minimum
//	addresses = ["10.88.0.0/16", "fd00::/8"]  # prefixes (default: any)
//	routes = ["0.0.0.0/0", "10.0.0.0/8"]      # destination prefixes (default: any)
//	dns = ["10.96.0.10"]                      # nameservers (patterns; default: any)
//	dns_search = ["default.svc.cluster.local"] # with dns: search domains (patterns; default: none)
//	hosts = ["10.1.2.3 db.internal"]          # with dns: /etc/hosts entries (patterns; default: the standard ones)
//	hostname = "re:web-[0-9]+"                # with dns: the pod's hostname (pattern; default: any one DNS label)
//
// With dns set, the owner pins name resolution, and the rest of it is
// pinned with it: the search and domain lines of /etc/resolv.conf must
// match dns_search, and each "address name" entry of /etc/hosts (which
// the resolver reads before asking DNS) must be a standard one (loopback
// names on a loopback address, the kubelet's ip6-* names, the pod's
// hostname on one of its own addresses) or match hosts (the pod's
// hostAliases). The host chooses the hostname, and an /etc/hosts entry
// naming the pod by it answers that name with the pod's own address: it
// is taken only if it matches hostname or, without hostname, if it is a
// single DNS label (so never "api.bank.example"), and the pod's names
// are then the hostname and its first label and, with hostname pinned,
// that label's FQDN in the pod's namespace (LABEL.SUBDOMAIN.DOMAIN,
// DOMAIN matching the first dns_search pattern). Pin hostname to keep
// the host from naming the pod after a short name it looks up (a
// service's).
//
// Whatever the section says, the guest refuses:
//   - an address or route destination in the loopback networks
//     (127.0.0.0/8, ::1), which would take over the pod's own loopback
//     traffic (a sidecar's, the agent's port-forward);
//   - an address that is unspecified, multicast or link-local, a gateway
//     that is loopback, unspecified or multicast, and a route through an
//     interface the request does not configure (lo);
//   - an interface named lo;
//   - a network on a container other than the pod's sandbox.
//
// Absent, DefaultNetwork applies: one interface, an MTU of at least
// 1280, any addresses, routes and DNS servers that are not refused
// above: a CNI bridge pod.
type Network struct {
	// MaxInterfaces bounds the NICs configured. Absent: 1.
	MaxInterfaces *int `toml:"max_interfaces"`
	// MinMTU bounds each interface's MTU from below. Absent: 1280. (68,
	// IPv4's minimum, fragments every TLS record.)
	MinMTU *uint32 `toml:"min_mtu"`
	// Addresses are CIDR prefixes each interface address must lie in.
	// Absent: any address not refused above.
	Addresses []string `toml:"addresses"`
	// Routes are CIDR prefixes each route's destination must lie in
	// (0.0.0.0/0 and ::/0 allow default routes). Absent: any.
	Routes []string `toml:"routes"`
	// DNS (patterns) are the nameserver entries the containers'
	// /etc/resolv.conf (passed by value by the host) may hold. Absent:
	// any; "re:" patterns match the address as written.
	DNS []Pattern `toml:"dns"`
	// DNSSearch (patterns) are the search and domain entries
	// /etc/resolv.conf may hold when DNS is set. Absent: none.
	DNSSearch []Pattern `toml:"dns_search"`
	// Hosts (patterns) are the /etc/hosts entries, each "address name"
	// (one name at a time, the address as written), allowed beside the
	// standard ones when DNS is set. Absent: the standard ones alone.
	Hosts []Pattern `toml:"hosts"`
	// Hostname (pattern) is the pod's hostname, the sandbox's, by which
	// /etc/hosts may name the pod on its own addresses when DNS is set.
	// Absent: any single DNS label.
	Hostname Pattern `toml:"hostname"`
}

// DefaultMaxInterfaces and DefaultMinMTU are the bounds of a network
// section that does not set them.
const (
	DefaultMaxInterfaces = 1
	DefaultMinMTU        = 1280
)

// DefaultNetwork is the network of a policy without [policy.network].
func DefaultNetwork() *Network { return &Network{} }

// NetworkOf returns the pod's network rule: p.Network, or DefaultNetwork.
func (p *Policy) NetworkOf() *Network {
	if p.Network == nil {
		return DefaultNetwork()
	}
	return p.Network
}

// InterfaceLimit returns the NICs allowed.
func (n *Network) InterfaceLimit() int {
	if n.MaxInterfaces == nil {
		return DefaultMaxInterfaces
	}
	return *n.MaxInterfaces
}

// MTULimit returns the least MTU allowed.
func (n *Network) MTULimit() uint32 {
	if n.MinMTU == nil {
		return DefaultMinMTU
	}
	return *n.MinMTU
}

// Loopback are the prefixes no address or route of the pod network may
// lie in.
var Loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// ParsePrefixes reads CIDR prefixes, masked ("10.0.0.5/8" is 10.0.0.0/8).
func ParsePrefixes(ss []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR prefix (10.0.0.0/8, fd00::/8)", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// PrefixWithin reports whether prefix p lies in one of in.
func PrefixWithin(p netip.Prefix, in []netip.Prefix) bool {
	for _, q := range in {
		if q.Addr().Is4() == p.Addr().Is4() && q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func (n *Network) validate(key string) error {
	var errs []error
	if n.MaxInterfaces != nil && (*n.MaxInterfaces < 0 || *n.MaxInterfaces > 64) {
		errs = append(errs, fmt.Errorf("%s.max_interfaces: %d is not 0 to 64", key, *n.MaxInterfaces))
	}
	if n.MinMTU != nil && (*n.MinMTU < 68 || *n.MinMTU > 65535) {
		errs = append(errs, fmt.Errorf("%s.min_mtu: %d is not 68 to 65535", key, *n.MinMTU))
	}
	if _, err := ParsePrefixes(n.Addresses); err != nil {
		errs = append(errs, fmt.Errorf("%s.addresses: %w", key, err))
	}
	if _, err := ParsePrefixes(n.Routes); err != nil {
		errs = append(errs, fmt.Errorf("%s.routes: %w", key, err))
	}
	for _, f := range []struct {
		name string
		ps   []Pattern
	}{{"dns", n.DNS}, {"dns_search", n.DNSSearch}, {"hosts", n.Hosts}} {
		for i, p := range f.ps {
			if err := p.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("%s.%s[%d]: %w", key, f.name, i, err))
			}
		}
	}
	if err := n.Hostname.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%s.hostname: %w", key, err))
	}
	if n.DNS == nil && (n.DNSSearch != nil || n.Hosts != nil || n.Hostname != "") {
		errs = append(errs, fmt.Errorf("%s.dns: not set, but dns_search, hosts or hostname is: they pin name resolution together with the nameservers: set dns too", key))
	}
	return errors.Join(errs...)
}
