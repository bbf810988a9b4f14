package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// Names the standard /etc/hosts entries give: those of a loopback address,
// and the kubelet's (and Debian's) IPv6 multicast and local names.
var (
	loopbackNames = []string{"localhost", "localhost.localdomain", "localhost4", "localhost4.localdomain4",
		"localhost6", "localhost6.localdomain6", "ip6-localhost", "ip6-loopback"}
	ip6Names    = []string{"ip6-localnet", "ip6-mcastprefix", "ip6-allnodes", "ip6-allrouters"}
	ip6Prefixes = []netip.Prefix{netip.MustParsePrefix("fe00::/8"), netip.MustParsePrefix("ff00::/8")}
)

// dns checks the name resolution the host gives a container, in its
// /etc/resolv.conf and /etc/hosts (host files passed by value), against
// [policy.network] dns, dns_search and hosts (policyapi.Network). Without
// dns the host's resolution is taken as it is.
func (e *Evaluator) dns(k *checker, spec *specs.Spec, kinds []policyapi.MountKind, files map[string][]byte) {
	rule := e.p.NetworkOf()
	if rule.DNS == nil || spec == nil {
		return
	}
	e.mu.Lock()
	hostname, own := e.podHostname, slices.Clone(e.podAddrs)
	e.mu.Unlock()
	for i, m := range spec.Mounts {
		if i >= len(kinds) || kinds[i] != policyapi.KindFile {
			continue
		}
		switch m.Destination {
		case "/etc/resolv.conf":
			k.resolvConf(rule, i, files[m.Source])
		case "/etc/hosts":
			k.hostsFile(rule, i, files[m.Source], hostname, own)
		}
	}
}

// PodWired records what the pod's sandbox c was wired with, once its
// network is up: its hostname and its interfaces' addresses, on which
// /etc/hosts may name the pod (dns). Not before: a network the policy
// admitted but the guest could not configure (a MAC no NIC has) must not
// lend its addresses to the pod's name. Only the claimed sandbox's, and
// what ReleaseSandbox gives back goes with the claim.
func (e *Evaluator) PodWired(c *Container, hostname string, n *PodNetwork) {
	if !e.Governs() || c == nil || !c.Identity.Sandbox() {
		return
	}
	var addrs []netip.Addr
	if n != nil {
		for _, ni := range n.Interfaces {
			for _, a := range ni.Addresses {
				if p, err := netip.ParsePrefix(a); err == nil {
					addrs = append(addrs, p.Addr())
				}
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sandbox == c.ID {
		e.podHostname, e.podAddrs = hostname, addrs
	}
}

// resolvConf checks the nameserver, search and domain lines. Every line,
// however long: a reader with a line limit would stop at a long one and
// judge nothing after it, which the resolver still reads.
func (k *checker) resolvConf(rule *policyapi.Network, i int, data []byte) {
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if !policyapi.MatchAny(rule.DNS, f[1]) {
				d := k.deny(fmt.Sprintf("mounts[%d] /etc/resolv.conf nameserver", i), fmt.Sprintf("%q", f[1]), networkKey+".dns", listed(policyapi.Strings(rule.DNS)))
				d.Hint = "the host's DNS server answers every name the pod looks up"
			}
		case "search", "domain":
			for _, domain := range f[1:] {
				if !policyapi.MatchAny(rule.DNSSearch, domain) {
					d := k.deny(fmt.Sprintf("mounts[%d] /etc/resolv.conf %s", i, f[0]), fmt.Sprintf("%q", domain), networkKey+".dns_search", listed(policyapi.Strings(rule.DNSSearch)))
					d.Hint = "a short name the pod looks up is tried in each search domain first: one the host chose answers it"
				}
			}
		}
	}
}

// hostsFile checks each entry of /etc/hosts, which the resolver reads
// before it asks a nameserver.
func (k *checker) hostsFile(rule *policyapi.Network, i int, data []byte, hostname string, own []netip.Addr) {
	field := fmt.Sprintf("mounts[%d] /etc/hosts", i)
	for _, line := range strings.Split(string(data), "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		ip, err := netip.ParseAddr(f[0])
		if err != nil || len(f) < 2 {
			k.deny(field, fmt.Sprintf("%q", strings.Join(f, " ")), "", "").Reason = "not an entry (an address and its names)"
			continue
		}
		for _, name := range f[1:] {
			entry := f[0] + " " + name
			if standardHost(rule, ip, name, hostname, own) || policyapi.MatchAny(rule.Hosts, entry) {
				continue
			}
			d := k.deny(field, fmt.Sprintf("%q", entry), networkKey+".hosts", listed(policyapi.Strings(rule.Hosts)))
			d.Hint = "the resolver answers a name in /etc/hosts before it asks the pinned nameservers"
		}
	}
}

// standardHost reports whether name on ip is an entry every pod's
// /etc/hosts has: a loopback name on a loopback address, an ip6-* name
// on an IPv6 local or multicast address, or one of the pod's own names
// (ownName) on one of its own addresses (PodWired: the sandbox's, which
// the pod's containers share).
func standardHost(rule *policyapi.Network, ip netip.Addr, name, hostname string, own []netip.Addr) bool {
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback():
		return slices.Contains(loopbackNames, name)
	case ip.Is6() && slices.ContainsFunc(ip6Prefixes, func(p netip.Prefix) bool { return p.Contains(ip) }):
		return slices.Contains(ip6Names, name)
	case slices.Contains(own, ip):
		return ownName(rule, hostname, name)
	}
	return false
}

// ownName reports whether the pod's hostname gives it name: the hostname
// itself, its first label, or, with the hostname pinned, that label's
// FQDN in the pod's own namespace (the kubelet's
// LABEL.SUBDOMAIN.NAMESPACE.svc.CLUSTER-DOMAIN), whose domain after the
// subdomain matches the first dns_search pattern (the kubelet writes the
// namespace's domain first). The host chooses the hostname, and these
// names answer with the pod's own address: it is taken only if it
// matches the policy's hostname or, without one, if it is a single DNS
// label, and then it names no FQDN (the host could choose another pod's
// name, db-0, and its FQDN db-0.db.NAMESPACE.svc.cluster.local). So the
// host can neither name the pod "api.bank.example" nor after a Service,
// "kubernetes.default.svc.cluster.local".
func ownName(rule *policyapi.Network, hostname, name string) bool {
	if hostname == "" || name == "" {
		return false
	}
	pinned := rule.Hostname != ""
	if pinned {
		if !rule.Hostname.Match(hostname) {
			return false
		}
	} else if !dnsLabel(hostname) {
		return false
	}
	short, _, _ := strings.Cut(hostname, ".")
	if name == hostname || name == short {
		return true
	}
	rest, ok := strings.CutPrefix(name, short+".")
	if !ok || !pinned || len(rule.DNSSearch) == 0 {
		return false
	}
	sub, domain, ok := strings.Cut(rest, ".")
	return ok && dnsLabel(sub) && rule.DNSSearch[0].Match(domain)
}

// dnsLabel reports whether s is one DNS label (RFC 1123): 1 to 63
// letters, digits and hyphens, not starting or ending with a hyphen.
func dnsLabel(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}
