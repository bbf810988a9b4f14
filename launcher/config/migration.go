package config

import (
	"fmt"
	"path/filepath"
)

// Migration is the [migration] table: how this node takes part in live
// migrations (launcher/migrate). Every key is optional:
//
//	[migration]
//	shared_storage_root = "/srv/c8s-shared"  # incoming VMs' disks must be below it
//	plain_loopback = false                   # allow an unencrypted stream on loopback
type Migration struct {
	// SharedStorageRoot is the directory of the storage this node shares
	// with its trust pool. As a destination, the node refuses an incoming
	// VM whose disk paths do not resolve (symbolic links followed) to a
	// file below it, and any path with a ".." element. Empty: the node
	// accepts no incoming VM with disks.
	SharedStorageRoot string `toml:"shared_storage_root"`
	// PlainLoopback lets the QEMU migration stream go unencrypted when both
	// ends are on loopback (127.0.0.0/8, ::1) and the destination has no
	// migration TLS identity; for tests and benchmarks on one host. Off
	// loopback the stream always uses TLS with the pool's certificates.
	PlainLoopback bool `toml:"plain_loopback"`
}

func (m Migration) validate() error {
	if m.SharedStorageRoot != "" && !filepath.IsAbs(m.SharedStorageRoot) {
		return fmt.Errorf("migration.shared_storage_root %q must be an absolute path", m.SharedStorageRoot)
	}
	return nil
}
