package policygen

import (
	"fmt"

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
	r.c.Pull, r.c.PullAuth, r.c.PullPlainHTTP = ref, p.Auth, p.PlainHTTP
	r.note("pull", "the guest pulls and verifies this image itself where the node offers no layer disks")
	if p.PlainHTTP {
		r.note("pull_plain_http", "the digests are still verified; the network sees which image the pod runs")
	}
	return nil
}
