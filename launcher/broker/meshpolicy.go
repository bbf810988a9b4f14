package broker

import (
	"fmt"
	"strings"

	"github.com/c8s-dev/c8s/guest/api/mesh"
)

// MeshPolicy is the [mesh] section of the owner's resource policy: the
// identities the mesh CA (MeshCA) issues, each to the workloads the same
// file defines, so that one file says what an attested pod is, which
// secrets it reads and which identity it holds in the mesh.
//
//	[mesh]
//	trust_domain = "example.org"
//
//	[[mesh.identities]]               # spiffe://example.org/ns/default/sa/web
//	namespace = "default"
//	service_account = "web"
//	workloads = ["web-app"]           # [workloads.web-app], as for resources
//
// A pod asks for one identity (mesh.identity in its measured init data);
// the CA issues it when a rule for that identity names a workload the
// pod's evidence shows it is (Workload's checks: TEE, init data digest,
// launch measurement, TCB, debug). No rule for it: refused (default deny).
type MeshPolicy struct {
	TrustDomain string          `toml:"trust_domain" json:"trust_domain"`
	Identities  []*MeshIdentity `toml:"identities" json:"identities"`
}

// MeshIdentity is one identity and the workloads that may hold it.
type MeshIdentity struct {
	Namespace      string   `toml:"namespace" json:"namespace"`
	ServiceAccount string   `toml:"service_account" json:"service_account"`
	Workloads      []string `toml:"workloads" json:"workloads"`

	id string // the SPIFFE ID
}

// ID is the identity's SPIFFE ID.
func (i *MeshIdentity) ID() string { return i.id }

func (m *MeshPolicy) validate(p *ResourcePolicy) error {
	if m == nil {
		return nil
	}
	if m.TrustDomain == "" {
		return fmt.Errorf("mesh.trust_domain is required: the trust domain of the SPIFFE IDs the mesh CA issues")
	}
	if len(m.Identities) == 0 {
		return fmt.Errorf("[mesh] has no [[mesh.identities]]: the mesh CA would issue nothing")
	}
	seen := map[string]bool{}
	for i, id := range m.Identities {
		id.id = mesh.IdentityURI(m.TrustDomain, id.Namespace, id.ServiceAccount)
		if err := mesh.CheckIdentity(id.id); err != nil {
			return fmt.Errorf("mesh.identities[%d]: %w (from mesh.trust_domain, namespace and service_account)", i, err)
		}
		if seen[id.id] {
			return fmt.Errorf("mesh.identities[%d]: %s is defined twice: list all its workloads in one rule", i, id.id)
		}
		seen[id.id] = true
		if len(id.Workloads) == 0 {
			return fmt.Errorf("mesh.identities[%d] (%s): no workloads: name the workloads that may hold it", i, id.id)
		}
		for _, w := range id.Workloads {
			if p.Workloads[w] == nil {
				return fmt.Errorf("mesh.identities[%d] (%s): workload %q is not defined under [workloads]", i, id.id, w)
			}
		}
	}
	return nil
}

// AllowIdentity returns nil if the owner's policy gives identity (a
// SPIFFE ID) to a workload a matches, or a *Denial naming each workload
// tried and the field that failed.
func (p *ResourcePolicy) AllowIdentity(identity string, a *Attested) error {
	d := &Denial{Resource: "mesh identity " + identity}
	if p == nil || p.Mesh == nil {
		d.Reasons = []string{"the owner's resource policy has no [mesh] section: add [mesh] with trust_domain and [[mesh.identities]]"}
		return d
	}
	for _, id := range p.Mesh.Identities {
		if id.id != identity {
			continue
		}
		for _, name := range id.Workloads {
			why := p.Workloads[name].check(a)
			if why == "" {
				return nil
			}
			d.Reasons = append(d.Reasons, fmt.Sprintf("%s: not workload %q of the identity", why, name))
		}
		return d
	}
	known := make([]string, len(p.Mesh.Identities))
	for i, id := range p.Mesh.Identities {
		known[i] = id.id
	}
	d.Reasons = []string{fmt.Sprintf("no [[mesh.identities]] rule gives it (default deny; the policy gives %s)", strings.Join(known, ", "))}
	return d
}
