package cvm

import (
	"context"
	"path/filepath"

	guestattest "github.com/c8s-dev/c8s/guest/attest"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
)

// Source asks the node's own secure processor for evidence binding
// reportData. guest/attest's providers are the sources: a node-as-CVM
// gathers its evidence as any confidential guest does.
type Source interface {
	Evidence(ctx context.Context, reportData [64]byte) (*guestattest.Evidence, error)
}

// SourceFor returns the evidence source for a node-as-CVM that discovery
// found under root: configfs-tsm where the kernel offers it (root "/"
// only: go-configfs-tsm uses the kernel's paths), else the guest device
// of the node's TEE. It returns nil when the node is not a CVM.
func SourceFor(root string, c discovery.NodeCVMInfo) Source {
	if root == "" {
		root = "/"
	}
	switch {
	case c.TEE == "":
		return nil
	case c.TSMReport && filepath.Clean(root) == "/":
		return guestattest.NewConfigfsTSM(nil)
	case c.TEE == discovery.SNP:
		return guestattest.NewSEVGuest(filepath.Join(root, guestattest.SEVGuestDevice))
	case c.TEE == discovery.TDX:
		return guestattest.NewTDXGuest(filepath.Join(root, guestattest.TDXGuestDevice))
	}
	return nil
}
