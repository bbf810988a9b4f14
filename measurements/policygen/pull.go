package policygen

import (
	"fmt"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// pull names the container's image for the guest to pull, where
// Options.Pull asks for it: the image must be pinned by digest, since the
// reference is all that binds what the guest pulls to the image.
func (g *gen) pull(r *rule, name, ref string) error {
	p, ok := g.o.Pull[name]
	if !ok {
		return nil
	}
	if _, err := policyapi.ParsePullRef(ref); err != nil {
		return fmt.Errorf("container %s: the guest pulls only a digest-pinned image: %w", name, err)
	}
	// (With plain HTTP the policy refuses the credentials, naming that.)
	if p.Auth != "" && !p.PlainHTTP && g.o.KBS.URL == "" {
		return fmt.Errorf("container %s: registry credentials %s are a key broker resource: name the broker (--kbs-url, --kbs-cert)", name, p.Auth)
	}
	if p.CA != "" {
		if p.PlainHTTP {
			return fmt.Errorf("container %s: a registry CA with plain HTTP: plain HTTP verifies no certificate", name)
		}
		if _, err := policyapi.ParsePullCA(p.CA); err != nil {
			return fmt.Errorf("container %s: the registry's CA: %w", name, err)
		}
	}
	r.c.Pull, r.c.PullAuth, r.c.PullPlainHTTP, r.c.PullCA = ref, p.Auth, p.PlainHTTP, p.CA
	r.note("pull", "the guest pulls and verifies this image itself where the node offers no layer disks")
	if p.CA != "" {
		r.note("pull_ca", "the only roots the guest verifies the registry's certificate against")
	}
	if p.PlainHTTP {
		r.note("pull_plain_http", "the digests are still verified; the network sees which image the pod runs")
	}
	return nil
}

// pullAuths reports whether a pull names registry credentials.
func (g *gen) pullAuths() bool {
	for _, p := range g.o.Pull {
		if p.Auth != "" {
			return true
		}
	}
	return false
}

// pullAuthSecrets are the [[kbs.secrets]] entries of the pulls'
// credentials not in seen: the broker releases a pod only the resources
// its document lists there. No rule mounts them (the guest's pull fetches
// them itself); the path is one no container sees.
func (g *gen) pullAuthSecrets(seen map[string]bool) []initdata.Secret {
	var out []initdata.Secret
	for _, n := range sortedKeys(g.o.Pull) {
		r := g.o.Pull[n].Auth
		if r == "" || seen[r] {
			continue
		}
		seen[r] = true
		out = append(out, initdata.Secret{Resource: r, Path: "/run/c8s/pull-auth/" + n})
	}
	return out
}
