package policy

import (
	"fmt"
	"slices"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// Guest pull (policyapi.Container.Pull): where a container's rule names a
// digest-pinned image, the host decides only whether to offer layer
// disks. If it offers none, the guest pulls the rule's reference itself
// (guest/pull); the reference is never the host's. If it offers some,
// they go through the layers check like any (the rule must pin them): a
// rule that names only pull refuses every root the host offers, disk or
// layers, since nothing would bind them to the image.

// PullImage returns the image the container's rule has the guest pull,
// and ok false when no policy governs the container or its rule names
// none.
func (c *Container) PullImage() (PullImage, bool) {
	if !c.Governed() || c.rule.Pull == "" {
		return PullImage{}, false
	}
	ref, ok := c.rule.PullRef()
	return PullImage{Ref: ref, Auth: c.rule.PullAuth, PlainHTTP: c.rule.PullPlainHTTP, CA: c.rule.PullCA}, ok
}

// PullImage is what a rule says of the image the guest pulls.
type PullImage struct {
	Ref       policyapi.PullRef
	Auth      string // the key broker resource of the credentials, or ""
	PlainHTTP bool
	CA        string // PEM roots of the registry's certificate, or "" (the image's bundle)
}

// pullRoot checks the root against the rule's pull reference and reports
// whether it decided (the layers check is then not needed).
func (k *checker) pullRoot(rule *policyapi.Container, root Root) bool {
	if root.Empty {
		if rule.Pull == "" {
			d := k.deny("rootfs", "(neither a disk nor layers)", k.key+".pull", "(not set)")
			d.Reason = "the host offered no root, and the rule names no image for the guest to pull"
			d.Hint = "pull = \"REGISTRY/REPO@sha256:…\" in the rule lets the guest pull the image itself"
		}
		return true
	}
	if rule.Pull == "" || len(rule.Layers) > 0 {
		return false
	}
	what := "(a root disk the host built)"
	if !root.HostDisk {
		what = fmt.Sprintf("(%d layer disks of the host's)", len(root.Layers))
	}
	d := k.deny("rootfs", what, k.key+".pull", fmt.Sprintf("%q, pulled by the guest", rule.Pull))
	d.Reason = "not allowed: the rule binds the image by its pull reference and pins no layers"
	d.Hint = "the guest verifies only what it pulls: a disk of the host's would substitute the image (pin the layers as well to let the node offer its converted disks)"
	return true
}

// PullImages returns the images the policy's rules have the guest pull,
// each once (an image two rules pull with other credentials or roots is
// two pulls), so that the agent can start pulling them as soon as the pod
// network is up, before their containers are created.
func (e *Evaluator) PullImages() []PullImage {
	if !e.Governs() {
		return nil
	}
	rules := make([]*policyapi.Container, 0, len(e.p.Containers)+1)
	if e.p.Sandbox != nil {
		rules = append(rules, e.p.Sandbox)
	}
	names := make([]string, 0, len(e.p.Containers))
	for n := range e.p.Containers {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		rules = append(rules, e.p.Containers[n])
	}
	var out []PullImage
	seen := map[PullImage]bool{}
	for _, r := range rules {
		ref, ok := r.PullRef()
		img := PullImage{Ref: ref, Auth: r.PullAuth, PlainHTTP: r.PullPlainHTTP, CA: r.PullCA}
		if !ok || seen[img] {
			continue
		}
		seen[img] = true
		out = append(out, img)
	}
	return out
}
