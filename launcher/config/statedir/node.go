package statedir

import "path/filepath"

// nodeDir is the directory of node-wide state under the root.
const nodeDir = "node"

// The node-wide state below <root>/node/. Every pod of the node shares it;
// these functions are its one spelling.

// SimSP is the directory of the node's simulated secure processor identity
// (the sim TEE's test-only ARK, ASK and VCEK; launcher/vm/tee/sim.Open).
func SimSP(root string) string { return filepath.Join(root, nodeDir, "sim-sp") }

// PoolRoots holds the PEM cert chains (ASK, ARK) of the other nodes of the
// node's trust pool, one *.pem file each, as the administrator installs
// them: a migration destination's evidence must chain to one of them or to
// the node's own root.
func PoolRoots(root string) string { return filepath.Join(root, nodeDir, "pool-roots") }

// MigrateTLS holds the node's migration TLS identity (launcher/migrate's
// TLSCertFile, TLSKeyFile and TLSCAFile).
func MigrateTLS(root string) string { return filepath.Join(root, nodeDir, "migrate-tls") }

// MigrateSocket is the unix socket on which `c8s-launcher serve` accepts
// incoming migrations unless told otherwise.
func MigrateSocket(root string) string { return filepath.Join(root, nodeDir, "migrate.sock") }

// MigrateLock is the file whose flock the node's migration server holds
// while it serves: the VMs migrating in under root (IncomingDir) are its
// alone. It is node state and stays when the server ends.
func MigrateLock(root string) string { return filepath.Join(root, nodeDir, "migrate.lock") }
