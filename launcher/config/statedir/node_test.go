package statedir

import "testing"

// The node-wide paths are on disk on existing nodes (the sim identity, the
// pool roots an administrator installed): their names must not change.
func TestNodePaths(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{SimSP("/run/c8s"), "/run/c8s/node/sim-sp"},
		{PoolRoots("/run/c8s"), "/run/c8s/node/pool-roots"},
		{MigrateTLS("/run/c8s"), "/run/c8s/node/migrate-tls"},
		{MigrateSocket("/run/c8s"), "/run/c8s/node/migrate.sock"},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
	// No pod namespace may take the node's directory.
	if NamespaceName(nodeDir) == nodeDir {
		t.Errorf("namespace %q keeps its name and would share the node's state", nodeDir)
	}
}
