package vm

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/manifest"
)

// RootDisk is a sealed image's root: a file system followed by its
// dm-verity hash tree, attached read-only as the VM's first virtio-blk disk,
// and the kernel parameters (root hash included) that make the guest's
// first stage map and verify it. Because the parameters are on the
// measured command line, the launch measurement covers every block.
type RootDisk struct {
	// Path is the host file.
	Path string
	// KernelParams name the device and the hash tree (guest/api/verity).
	KernelParams []string
	// RootHash is the hash tree's root: it stands for every block.
	RootHash string
}

// RootFor returns the root disk of the image cfg boots: the image manifest
// (attestation.manifest, by default beside hypervisor.kernel) says whether
// the image is sealed, gives the verity parameters and names the rootfs
// artefact, which hypervisor.rootfs may override. It returns nil for an
// unsealed image, or when there is no manifest and no hypervisor.rootfs.
func RootFor(cfg *config.Config) (*RootDisk, error) {
	path := cfg.ManifestPath()
	m, err := manifest.Load(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && cfg.Hypervisor.Rootfs == "" {
			return nil, nil
		}
		return nil, fmt.Errorf("the sealed root disk needs the image manifest: %w", err)
	}
	if !m.Sealed() {
		if cfg.Hypervisor.Rootfs != "" {
			return nil, fmt.Errorf("hypervisor.rootfs is set but the image manifest %s describes no verity-protected rootfs: rebuild the image with `make image` or unset hypervisor.rootfs", path)
		}
		return nil, nil
	}
	disk := cfg.Hypervisor.Rootfs
	if disk == "" {
		if disk, err = m.Path(filepath.Dir(path), manifest.RoleRootfs); err != nil {
			return nil, err
		}
	}
	return &RootDisk{Path: disk, KernelParams: m.RootKernelParams(), RootHash: m.Verity.RootHash}, nil
}
