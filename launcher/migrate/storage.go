package migrate

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/c8s-dev/c8s/launcher/vm"
)

// checkDiskPaths is the destination's rule for the disks an incoming VM
// brings: each path must be absolute, have no ".." element, and resolve
// (symbolic links followed) to a regular file or block device strictly
// below root, the node's migration.shared_storage_root, itself resolved.
// It returns the disks with their resolved paths, which QEMU then opens,
// so a link swapped after the check is not followed. With no root, no
// disk is accepted.
//
// A directory on the shared storage replaced by a link between this check
// and QEMU's open is not caught; the storage's writers are pool members.
func checkDiskPaths(root string, disks []vm.Disk) ([]vm.Disk, error) {
	if len(disks) == 0 {
		return nil, nil
	}
	if root == "" {
		return nil, fmt.Errorf("the VM brings disk %q at %s, but this node has no migration.shared_storage_root: set it to the directory of the storage it shares with its trust pool", disks[0].ID, disks[0].Path)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fmt.Errorf("migration.shared_storage_root %s: %w", root, err)
	}
	out := make([]vm.Disk, 0, len(disks))
	for _, d := range disks {
		p, err := resolveBelow(realRoot, d.Path)
		if err != nil {
			return nil, fmt.Errorf("disk %q at %s refused: %w (migration.shared_storage_root is %s)", d.ID, d.Path, err, root)
		}
		d.Path = p
		out = append(out, d)
	}
	return out, nil
}

// resolveBelow resolves path and checks it names a disk below realRoot.
func resolveBelow(realRoot, path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("the path is not absolute")
	}
	for _, el := range strings.Split(path, "/") {
		if el == ".." {
			return "", fmt.Errorf(`the path has a ".." element`)
		}
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(realRoot, real)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", fmt.Errorf("it resolves to %s, outside the shared storage root", real)
	}
	st, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if m := st.Mode(); !m.IsRegular() && m&os.ModeDevice == 0 {
		return "", fmt.Errorf("it resolves to %s, which is neither a regular file nor a block device", real)
	}
	return real, nil
}
