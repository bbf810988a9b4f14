// Package statedir lays out runtime.state_dir, the root under which pod
// VMs keep their sockets, disks and logs. It is the one place that names a
// pod's directories, so that the shim creating them, `shim delete` after a
// dead shim, the migration server and the node agent's scan agree:
//
//	<root>/<ns>/<pod>/        the VM's state dir: qmp.sock, agent.sock,
//	                          <port>.sock, console.log, qemu.pid,
//	                          pod.json (IndexFile), migrated.json
//	<root>/<ns>/disks/<pod>/  the containers' root disks
//	<root>/<ns>/fs/<pod>/     the virtio-fs share (virtiofsd.sock)
//	<root>/migrate/<pod>/     the state dir of a VM migrating in
//	<root>/node/, cache/      node-wide state; node/ holds sim-sp/ (SimSP),
//	                          pool-roots/ (PoolRoots), migrate-tls/
//	                          (MigrateTLS), migrate.sock (MigrateSocket)
//	                          and migrate.lock (MigrateLock)
//
// A unix socket's path is at most UnixPathMax bytes, while containerd
// namespaces and IDs may have 76 bytes each (and CRI sandbox IDs have 64),
// so the names <ns> and <pod> have a bounded length: a namespace of at most
// 16 bytes and an ID of at most 24 are kept as they are when made of
// letters, digits, '.', '_' and '-' (starting with a letter or digit) and
// not a name the layout itself uses there; any other is shortened to a
// prefix, '-' and the start of its SHA-256, one byte longer than the longest
// kept name, so a shortened name never equals a kept one. Every socket
// then fits when the root is at most MaxRoot bytes and the socket's file
// name at most MaxSocketName; the VM's state dir holds IndexFile, which
// maps a shortened name back to the namespace and ID.
package statedir

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
)

const (
	// UnixPathMax is the longest unix socket path: sun_path's size minus
	// the terminating NUL.
	UnixPathMax = 107
	// MaxRoot is the longest runtime.state_dir (cleaned) the layout fits
	// in UnixPathMax; the configuration refuses a longer one.
	MaxRoot = 40
	// MaxSocketName is the longest file name a unix socket in a pod's
	// directories may have: the deepest is <root>/<ns>/fs/<pod>/<name>.
	MaxSocketName = UnixPathMax - MaxRoot - len("/") - (nsKeep + 1) - len("/"+fsDir+"/") - (podKeep + 1) - len("/")
	// MaxDepth is how deep VM state dirs lie below the root: <root>/<ns>/<pod>
	// for the shim's, <root>/migrate/<pod> for incoming migrations and
	// <root>/<id> for c8s-launcher's own.
	MaxDepth = 2
	// IndexFile, in a VM's state dir, records what the VM is (Index).
	IndexFile = "pod.json"
)

const (
	nsKeep    = 16 // longest namespace kept as it is
	nsPrefix  = 8  // longest prefix of a shortened namespace
	podKeep   = 24 // longest ID kept as it is
	podPrefix = 12 // longest prefix of a shortened ID
	disksDir  = "disks"
	fsDir     = "fs"
	migrateIn = "migrate"
)

// rootNames are the names the layout and node-wide state use directly
// under the root; no namespace is given them.
var rootNames = []string{migrateIn, nodeDir, "cache", "check"}

// podSiblings are the names beside the pods' state dirs in a namespace.
var podSiblings = []string{disksDir, fsDir}

// Pod is where one pod keeps its state.
type Pod struct {
	// VM is the VM's state dir (vm.Spec.StateDir).
	VM string
	// Disks holds the containers' root disks.
	Disks string
	// FS is the directory of the pod's virtio-fs share.
	FS string
}

// ForPod returns the directories of the pod (sandbox) id of containerd
// namespace ns under root.
func ForPod(root, ns, id string) Pod {
	nsDir := filepath.Join(root, NamespaceName(ns))
	p := PodName(id)
	return Pod{
		VM:    filepath.Join(nsDir, p),
		Disks: filepath.Join(nsDir, disksDir, p),
		FS:    filepath.Join(nsDir, fsDir, p),
	}
}

// FSDir is the virtio-fs share's directory of the pod whose VM state dir
// ForPod returned as vmDir (for `shim delete`, which recorded only that).
func FSDir(vmDir string) string {
	return filepath.Join(filepath.Dir(vmDir), fsDir, filepath.Base(vmDir))
}

// Incoming is the state dir of VM id while it migrates in.
func Incoming(root, id string) string {
	return filepath.Join(root, migrateIn, PodName(id))
}

// IncomingDir is the directory of the state dirs of VMs migrating in
// (Incoming), which one migration server at a time owns.
func IncomingDir(root string) string { return filepath.Join(root, migrateIn) }

// Standalone is the state dir of a VM that c8s-launcher runs outside any
// namespace.
func Standalone(root, id string) string {
	return filepath.Join(root, PodName(id))
}

// NamespaceName is the directory name of containerd namespace ns.
func NamespaceName(ns string) string {
	return shorten(ns, nsKeep, nsPrefix, rootNames)
}

// PodName is the directory name of pod (sandbox) ID id.
func PodName(id string) string {
	return shorten(id, podKeep, podPrefix, podSiblings)
}

// shorten returns s when it is a safe name of at most keep bytes and not
// reserved, else a name of exactly keep+1 bytes: s's first bytes (at most
// prefix; '_' for a byte that is not a letter, digit, '.', '_' or '-', and
// for a first byte that is not a letter or digit), '-' and a digest of s.
func shorten(s string, keep, prefix int, reserved []string) string {
	if len(s) <= keep && safe(s) && !slices.Contains(reserved, s) {
		return s
	}
	p := []byte(s[:min(len(s), prefix)])
	for i, b := range p {
		if !nameByte(b) || i == 0 && !alnum(b) {
			p[i] = '_'
		}
	}
	if len(p) == 0 {
		p = []byte{'_'}
	}
	sum := sha256.Sum256([]byte(s))
	return string(p) + "-" + hex.EncodeToString(sum[:])[:keep-len(p)]
}

// safe reports whether s is a file name that needs no shortening.
func safe(s string) bool {
	if s == "" || !alnum(s[0]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return false
		}
	}
	return true
}

func alnum(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}

func nameByte(b byte) bool { return alnum(b) || b == '.' || b == '_' || b == '-' }

// Index is what IndexFile records: the names a VM's state dir stands
// for, in full.
type Index struct {
	// Namespace is the pod's containerd namespace (empty outside one).
	Namespace string `json:"namespace,omitempty"`
	// ID is the VM's ID: the pod's sandbox ID.
	ID string `json:"id"`
}

// WriteIndex writes IndexFile into the state dir dir.
func WriteIndex(dir string, ix Index) error {
	b, err := json.Marshal(ix)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, IndexFile), append(b, '\n'), 0o600)
}

// ReadIndex reads IndexFile from the state dir dir.
func ReadIndex(dir string) (Index, error) {
	var ix Index
	b, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		return ix, err
	}
	return ix, json.Unmarshal(b, &ix)
}
