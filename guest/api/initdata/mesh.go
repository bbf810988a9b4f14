package initdata

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
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
//
//	[[mesh.inbound]]                # the proxy listens on POD_IP:5432 (TLS) and
//	port = 5432                     # forwards to 127.0.0.1:5432, where the
//	allow = ["spiffe://example.org/ns/default/sa/web"]  # workload listens
//
//	[[mesh.outbound]]               # the proxy listens on 127.0.0.1:6379 and
//	port = 6379                     # connects to the upstream in TLS, which
//	upstream = "10.96.0.20:6379"    # must present the identity
//	identity = "spiffe://example.org/ns/default/sa/cache"
//
// allow and identity are patterns (guest/api/policy Pattern: exact, or
// "re:EXPR"). Meshed ports cannot be port-forwarded by the host: a forward
// to an inbound port would reach the workload's plaintext, one to an
// outbound port would let the host connect under the pod's identity.
type Mesh struct {
	URL        string         `toml:"url"`
	Cert       string         `toml:"cert"`
	CA         string         `toml:"ca"`
	Identity   string         `toml:"identity"`
	Containers []string       `toml:"containers"`
	Inbound    []MeshInbound  `toml:"inbound"`
	Outbound   []MeshOutbound `toml:"outbound"`
}

// MeshInbound is a port of the pod that only mesh peers reach.
type MeshInbound struct {
	// Port is the pod port: the proxy listens on it on the pod's
	// addresses, the workload on 127.0.0.1.
	Port uint32 `toml:"port"`
	// Allow are the peer identities that may connect (patterns).
	Allow []policy.Pattern `toml:"allow"`
}

// MeshOutbound is a peer the workload reaches through the proxy.
type MeshOutbound struct {
	// Port is where the proxy listens, on 127.0.0.1 in the pod.
	Port uint32 `toml:"port"`
	// Upstream is the peer's IP:PORT.
	Upstream string `toml:"upstream"`
	// Identity is the identity the peer must present (pattern).
	Identity policy.Pattern `toml:"identity"`
}

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

// Ports are every meshed port: inbound pod ports and outbound local ones.
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
	seen := map[uint32]string{}
	port := func(what string, p uint32) error {
		if p == 0 || p > 65535 {
			return fmt.Errorf("init data: %s = %d is not a TCP port: use 1 to 65535", what, p)
		}
		if other, ok := seen[p]; ok {
			return fmt.Errorf("init data: %s = %d is %s too: the workload listens on 127.0.0.1 on inbound ports, the proxy on outbound ones, so each port is meshed once", what, p, other)
		}
		seen[p] = what
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
		host, p, err := net.SplitHostPort(o.Upstream)
		if err != nil || net.ParseIP(host) == nil {
			return fmt.Errorf("init data: mesh.outbound[%d].upstream %q: want IP:PORT (the agent resolves no names: the pod's DNS is the host's)", i, o.Upstream)
		}
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("init data: mesh.outbound[%d].upstream %q: bad port", i, o.Upstream)
		}
		if o.Identity == "" {
			return fmt.Errorf("init data: mesh.outbound[%d] (upstream %s) names no identity: say which peer must answer", i, o.Upstream)
		}
		if err := o.Identity.Validate(); err != nil {
			return fmt.Errorf("init data: mesh.outbound[%d].identity: %w", i, err)
		}
	}
	return nil
}
