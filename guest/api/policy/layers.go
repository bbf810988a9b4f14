package policy

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Layer is one image layer as the policy pins it. `c8s-measure image`
// prints these for an image; `c8s-measure policy` writes them.
//
//	[[policy.containers.app.layers]]
//	digest = "sha256:5f70bf18…"   # the layer's diff ID
//	verity = "9c3a…"              # dm-verity root hash, hex
//	blocks = 1187                 # 4096-byte data blocks under the tree
//
// The host attaches each layer as a read-only disk in c8s's layer format
// (measurements/layer: the layer's files as ext4, then the dm-verity hash
// tree, sha256, 4096-byte blocks, no salt). The guest opens it through
// dm-verity with Verity and Blocks from here, never the host's, so that a
// block the host changed fails to read and a layer swapped for another
// (with its own valid tree) does not open at all.
type Layer struct {
	// Digest is the layer's diff ID: sha256 of its uncompressed tar, as
	// the image config's rootfs.diff_ids lists it.
	Digest string `toml:"digest"`
	// Verity is the root hash of the layer disk's dm-verity tree, hex.
	Verity string `toml:"verity"`
	// Blocks is the number of 4096-byte data blocks the tree covers; the
	// tree starts right after them.
	Blocks uint64 `toml:"blocks"`
}

// validateLayers checks the layers of the rule at key.
func validateLayers(key string, layers []Layer) error {
	var errs []error
	for i, l := range layers {
		bad := func(field, format string, a ...any) {
			errs = append(errs, fmt.Errorf("%s.layers[%d].%s: %s", key, i, field, fmt.Sprintf(format, a...)))
		}
		if hexPart, ok := strings.CutPrefix(l.Digest, "sha256:"); !ok || !isHex(hexPart, 32) {
			bad("digest", "%q is not a diff ID (sha256:<64 hex digits>, as `c8s-measure image` prints it)", l.Digest)
		}
		if !isHex(l.Verity, 32) {
			bad("verity", "%q is not a dm-verity root hash (64 hex digits, as `c8s-measure image` prints it)", l.Verity)
		}
		if l.Blocks == 0 {
			bad("blocks", "required: the layer disk's data blocks, as `c8s-measure image` prints them")
		}
	}
	return errors.Join(errs...)
}

// isHex reports whether s is n bytes in lower-case hex.
func isHex(s string, n int) bool {
	if len(s) != 2*n || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}
