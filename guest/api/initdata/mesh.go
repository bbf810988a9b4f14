package initdata

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"

	"github.com/c8s-dev/c8s/guest/api/mesh"
	"github.com/c8s-dev/c8s/guest/api/policy"
)

// Mesh is the pod's place in the attested mesh (guest/api/mesh): where its
// workload certificate comes from, which identity it asks for, and which
// of its ports the agent's proxy wraps in mutual TLS. It is part of the
// measured document, so the host can neither change which ports are
// meshed, nor which peers may connect, nor which CA the pod trusts.
//
//	[mesh]
//	url = "https://10.0.0.1:8443"   # the owner's mesh CA (c8s-launcher mesh-ca)
//	cert = "-----BEGIN CERTIFICATE-----..."  # its TLS certificate, the only root
//	                                # the agent trusts for the CA endpoint
//	ca = "-----BEGIN CERTIFICATE-----..."    # the mesh CA: peers' and the pod's
//	                                # own certificates must chain to it
//	identity = "spiffe://example.org/ns/default/sa/db"  # the identity asked for
//	containers = ["db"]             # containers that see /run/c8s/mesh
//	unmeshed = "pass"               # the pod's other traffic: "pass" (the
//	                                # default) or "refuse" (dropped both ways)
//
//	[[mesh.inbound]]                # TCP to POD_IP:5432 from outside the pod is
//	port = 5432                     # redirected to the proxy, which requires
//	allow = ["spiffe://example.org/ns/default/sa/web"]  # mutual TLS from an
//	                                # allowed peer and forwards to 127.0.0.1:5432
//
//	[[mesh.outbound]]               # TCP the workload opens to port 6379 of a
//	port = 6379                     # peer is redirected to the proxy, which
//	peers = ["10.96.0.0/16"]        # carries it in mutual TLS to the same
//	identity = "spiffe://example.org/ns/default/sa/cache"  # address and port;
//	                                # the peer must present the identity
//
// The mesh is transparent: the agent programs the redirects (nftables, in
// the pod's network namespace) from this section, and the workload listens
// and dials as it would without it. peers (addresses or CIDRs) bounds an
// outbound entry; without it the port is meshed on every address but the
// pod's own. A port meshed on its peers only is dropped to any other
// address, never sent there in plaintext (the pod's DNS is the host's: it
// could answer with an address outside peers). Other traffic passes untouched, or, with unmeshed =
// "refuse", is dropped: new connections from outside the pod to other
// ports, and new connections the pod opens outside the mesh (DNS and
// probes of the kubelet included); replies and ICMPv6 pass.
//
// allow and identity are patterns (guest/api/policy Pattern: exact, or
// "re:EXPR"). Meshed ports cannot be port-forwarded by the host: a forward
// to an inbound port would reach the workload's plaintext, one to an
// outbound port is kept out of the mesh only because it is local, which a
// policy should not lean on.
type Mesh struct {
	URL        string         `toml:"url"`
	Cert       string         `toml:"cert"`
	CA         string         `toml:"ca"`
	Identity   string         `toml:"identity"`
	Containers []string       `toml:"containers"`
	Unmeshed   string         `toml:"unmeshed"`
	Inbound    []MeshInbound  `toml:"inbound"`
	Outbound   []MeshOutbound `toml:"outbound"`
}

// MeshInbound is a port of the pod that only mesh peers reach.
type MeshInbound struct {
	// Port is the pod port: connections to it from outside the pod go to
	// the proxy, which forwards to the workload on 127.0.0.1:Port.
	Port uint32 `toml:"port"`
	// Allow are the peer identities that may connect (patterns).
	Allow []policy.Pattern `toml:"allow"`
}

// MeshOutbound is a destination the workload reaches through the proxy.
type MeshOutbound struct {
	// Port is the peers' port: connections the workload opens to it go to
	// the proxy, which carries them in mutual TLS.
	Port uint32 `toml:"port"`
	// Peers are the addresses (IP or CIDR) the entry covers; none: every
	// address but the pod's own.
	Peers []string `toml:"peers"`
	// Identity is the identity the peer must present (pattern).
	Identity policy.Pattern `toml:"identity"`
}

// Prefixes are Peers as prefixes (an address is a /32 or /128).
func (o MeshOutbound) Prefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, p := range o.Peers {
		if a, err := netip.ParseAddr(p); err == nil && a.Zone() == "" {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		pf, err := netip.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("peer %q is not an IP address or CIDR (the agent resolves no names: the pod's DNS is the host's)", p)
		}
		if pf.Addr().Is4In6() {
			return nil, fmt.Errorf("peer %q: give IPv4 networks in IPv4 form", p)
		}
		out = append(out, pf.Masked())
	}
	return out, nil
}

// Covers reports whether the entry covers destination dst.
func (o MeshOutbound) Covers(dst netip.AddrPort) bool {
	if dst.Port() != uint16(o.Port) {
		return false
	}
	pfs, err := o.Prefixes()
	if err != nil {
		return false
	}
	if len(pfs) == 0 {
		return true
	}
	for _, p := range pfs {
		if p.Contains(dst.Addr().Unmap()) {
			return true
		}
	}
	return false
}

// The values of mesh.unmeshed.
const (
	UnmeshedPass   = "pass"
	UnmeshedRefuse = "refuse"
)

// RefusesUnmeshed reports whether the pod's traffic outside the mesh is
// dropped (unmeshed = "refuse").
func (m *Mesh) RefusesUnmeshed() bool { return m.Enabled() && m.Unmeshed == UnmeshedRefuse }

// Enabled reports whether the pod is in a mesh.
func (m *Mesh) Enabled() bool { return m != nil && m.URL != "" }

// Address is the CA's host:port (443 when the URL names none).
func (m *Mesh) Address() (string, error) {
	u, err := url.Parse(m.URL)
	if err != nil {
		return "", fmt.Errorf("init data: mesh.url: %w", err)
	}
	if u.Scheme != "https" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") {
		return "", fmt.Errorf("init data: mesh.url %q: want https://HOST[:PORT]", m.URL)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "443"), nil
	}
	return u.Host, nil
}

// CertPool returns a pool holding only the CA endpoint's TLS certificate.
func (m *Mesh) CertPool() (*x509.CertPool, error) { return onePool("mesh.cert", m.Cert) }

// CAPool returns a pool holding only the mesh CA.
func (m *Mesh) CAPool() (*x509.CertPool, error) { return onePool("mesh.ca", m.CA) }

func onePool(field, data string) (*x509.CertPool, error) {
	blk, rest := pem.Decode([]byte(data))
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("init data: %s is not a PEM CERTIFICATE", field)
	}
	if b, _ := pem.Decode(rest); b != nil {
		return nil, fmt.Errorf("init data: %s holds more than one certificate: give the one to trust", field)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("init data: %s: %w", field, err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return pool, nil
}

// MountedInto reports whether the container named name (its CRI name, or
// its id outside CRI) sees the mesh files.
func (m *Mesh) MountedInto(name string) bool {
	return m.Enabled() && slices.Contains(m.Containers, name)
}

// Ports are every meshed port: inbound pod ports and outbound peer ones.
func (m *Mesh) Ports() []uint32 {
	var out []uint32
	for _, in := range m.Inbound {
		out = append(out, in.Port)
	}
	for _, o := range m.Outbound {
		out = append(out, o.Port)
	}
	return out
}

// validate checks the section against the rest of the document a.
func (m *Mesh) validate(a AgentPolicy) error {
	if m == nil {
		return nil
	}
	if m.URL == "" {
		return errors.New("init data: mesh.url is required in a [mesh] section: the owner's mesh CA")
	}
	if _, err := m.Address(); err != nil {
		return err
	}
	if _, err := m.CertPool(); err != nil {
		return err
	}
	if _, err := m.CAPool(); err != nil {
		return err
	}
	if err := mesh.CheckIdentity(m.Identity); err != nil {
		return fmt.Errorf("init data: mesh.identity: %w", err)
	}
	for i, c := range m.Containers {
		if c == "" || c == "sandbox" {
			return fmt.Errorf("init data: mesh.containers[%d] = %q: name a container of the pod (the sandbox never sees the mesh files)", i, c)
		}
	}
	switch m.Unmeshed {
	case "", UnmeshedPass, UnmeshedRefuse:
	default:
		return fmt.Errorf("init data: mesh.unmeshed = %q: want %q (the pod's other traffic passes untouched) or %q (it is dropped)", m.Unmeshed, UnmeshedPass, UnmeshedRefuse)
	}
	inbound := map[uint32]string{}
	port := func(what string, p uint32) error {
		if p == 0 || p > 65535 {
			return fmt.Errorf("init data: %s = %d is not a TCP port: use 1 to 65535", what, p)
		}
		if slices.Contains(a.AllowPortForward, p) {
			return fmt.Errorf("init data: %s = %d is in agent_policy.allow_port_forward: a port-forward would bypass the mesh (the workload's plaintext, or a connection under the pod's identity); remove it from one", what, p)
		}
		return nil
	}
	for i, in := range m.Inbound {
		what := "mesh.inbound[" + strconv.Itoa(i) + "].port"
		if err := port(what, in.Port); err != nil {
			return err
		}
		if other, ok := inbound[in.Port]; ok {
			return fmt.Errorf("init data: %s = %d is %s too: give each inbound port once, with every identity it allows", what, in.Port, other)
		}
		inbound[in.Port] = what
		if len(in.Allow) == 0 {
			return fmt.Errorf("init data: mesh.inbound[%d] (port %d) allows no peer: list the identities that may connect", i, in.Port)
		}
		for _, p := range in.Allow {
			if err := p.Validate(); err != nil {
				return fmt.Errorf("init data: mesh.inbound[%d].allow: %w", i, err)
			}
		}
	}
	for i, o := range m.Outbound {
		what := "mesh.outbound[" + strconv.Itoa(i) + "].port"
		if err := port(what, o.Port); err != nil {
			return err
		}
		pfs, err := o.Prefixes()
		if err != nil {
			return fmt.Errorf("init data: mesh.outbound[%d].peers: %w", i, err)
		}
		if len(pfs) == 0 && countPort(m.Outbound, o.Port) > 1 {
			return fmt.Errorf("init data: mesh.outbound[%d] meshes port %d on every address, and another entry names the port too: bound each with peers (the first entry that covers a destination decides)", i, o.Port)
		}
		if o.Identity == "" {
			return fmt.Errorf("init data: mesh.outbound[%d] (port %d) names no identity: say which peer must answer", i, o.Port)
		}
		if err := o.Identity.Validate(); err != nil {
			return fmt.Errorf("init data: mesh.outbound[%d].identity: %w", i, err)
		}
	}
	return nil
}

// countPort counts the outbound entries for port.
func countPort(out []MeshOutbound, port uint32) int {
	n := 0
	for _, o := range out {
		if o.Port == port {
			n++
		}
	}
	return n
}
