package policy

import (
	"fmt"
	"strconv"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// Root is a container's root file system as the host asks for it
// (agent API Rootfs).
type Root struct {
	// HostDisk is set when the root is a disk the host built (the
	// request's Rootfs.source): any file system of the host's choosing.
	HostDisk bool
	// Layers are the image layers the root is stacked from, bottom first
	// (Rootfs.layers): each its diff ID, and the dm-verity root (Verity)
	// and data blocks the host says its disk has.
	Layers []policyapi.Layer
	// Empty is set when the host offered neither a disk nor layers: the
	// guest pulls the image the rule names, or refuses (pull.go).
	Empty bool
}

// PinnedLayers returns the layers the container's rule pins, bottom
// first, or nil when nothing pins its root (no policy, or a rule without
// layers). The guest opens each layer the host names at position i whose
// digest is PinnedLayers()[i]'s with the rule's root hash and blocks; an
// enforced policy has made sure that they are all of them.
func (c *Container) PinnedLayers() []policyapi.Layer {
	if !c.Governed() {
		return nil
	}
	return c.rule.Layers
}

// layers checks the root against the rule's layers, when it pins them: a
// root the host built is refused (it would substitute the image), and the
// host's layers must be the rule's, digest by digest in order, each with
// the rule's dm-verity root and blocks. The guest opens each layer with
// the rule's root (PinnedLayers), so a disk with another tree does not
// open; a host value that differs is refused here all the same, so that
// the denial says which.
func (k *checker) layers(rule *policyapi.Container, root Root) {
	if len(rule.Layers) == 0 {
		return
	}
	key := k.key + ".layers"
	if root.HostDisk {
		d := k.deny("rootfs.source", "(a root disk the host built)", key, fmt.Sprintf("the image's %d layers", len(rule.Layers)))
		d.Reason = "not allowed: the rule pins the image's layers"
		d.Hint = "a disk the host built can hold any file system: the image substitution the pinned layers stop"
		return
	}
	const orderHint = "a rule pins the image's layers by diff ID, bottom first: a layer missing, added, swapped or out of order changes the container's files"
	for i := range max(len(rule.Layers), len(root.Layers)) {
		field := fmt.Sprintf("layers[%d]", i)
		switch {
		case i >= len(root.Layers):
			d := k.deny(field+".digest", "", key, strconv.Quote(rule.Layers[i].Digest))
			d.Reason, d.Hint = "missing, required", orderHint
		case i >= len(rule.Layers):
			d := k.deny(field+".digest", strconv.Quote(root.Layers[i].Digest), key, fmt.Sprintf("%d layers", len(rule.Layers)))
			d.Hint = orderHint
		case root.Layers[i].Digest != rule.Layers[i].Digest:
			d := k.deny(field+".digest", strconv.Quote(root.Layers[i].Digest), key, strconv.Quote(rule.Layers[i].Digest))
			d.Hint = orderHint
		default:
			got, want := root.Layers[i], rule.Layers[i]
			if got.Verity != want.Verity {
				d := k.deny(field+".root_hash", strconv.Quote(got.Verity), fmt.Sprintf("%s[%d].verity", key, i), strconv.Quote(want.Verity))
				d.Hint = "the guest opens a layer with the policy's dm-verity root only: a disk with another tree is another layer's, or a layer the host changed"
			}
			if got.Blocks != want.Blocks {
				d := k.deny(field+".data_blocks", strconv.FormatUint(got.Blocks, 10), fmt.Sprintf("%s[%d].blocks", key, i), strconv.FormatUint(want.Blocks, 10))
				d.Hint = "the guest opens a layer with the policy's data blocks only"
			}
		}
	}
}
