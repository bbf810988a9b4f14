package layercache

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/c8s-dev/c8s/internal/child"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// Ref is one pod's use of a layer: a file refs/<hex>/<Name>, written
// before the layer is attached and removed when it is detached or the pod
// ends. A reference whose shim and QEMU are both gone is stale: Prune
// ignores and removes it.
type Ref struct {
	// Name is the file name: unique per pod on the node.
	Name string `json:"-"`
	// Namespace and Pod name the pod (containerd namespace, sandbox id).
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	// StateDir is the pod VM's state dir, holding QEMU's pid file.
	StateDir string `json:"state_dir,omitempty"`
	// PID is the process that holds the reference (the pod's shim) and
	// Start its start time (/proc/<pid>/stat field 22), so that a reused
	// pid does not keep a reference alive.
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// PodRef is the reference of pod (containerd namespace ns, sandbox id
// pod, VM state dir stateDir) held by the calling process.
func PodRef(ns, pod, stateDir string) (Ref, error) {
	pid := os.Getpid()
	start, err := child.StartTime(pid)
	if err != nil {
		return Ref{}, fmt.Errorf("layer cache: read this process's start time: %w", err)
	}
	sum := sha256.Sum256([]byte(ns + "\x00" + pod))
	return Ref{Name: hex.EncodeToString(sum[:12]), Namespace: ns, Pod: pod, StateDir: stateDir, PID: pid, Start: start}, nil
}

func (r Ref) check() error {
	if r.Name == "" || r.Name != filepath.Base(r.Name) || strings.HasPrefix(r.Name, ".") {
		return fmt.Errorf("layer cache: reference name %q is not a file name", r.Name)
	}
	return nil
}

// writeRef records ref for the layer hex. The caller holds its lock.
func (c *Cache) writeRef(hex string, ref Ref) error {
	data, err := json.Marshal(ref)
	if err != nil {
		return err
	}
	dir := c.refDir(hex)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("layer cache: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ref.Name), data, 0o600); err != nil {
		return fmt.Errorf("layer cache: record the reference of pod %s: %w", ref.Pod, err)
	}
	return nil
}

// removeRef removes a reference of the layer hex, and the layer's refs
// directory once empty. The caller holds its lock.
func (c *Cache) removeRef(hex, name string) error {
	dir := c.refDir(hex)
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("layer cache: %w", err)
	}
	os.Remove(dir) // fails while other pods hold references
	return nil
}

// RefState is a reference as Prune and List see it.
type RefState struct {
	Ref
	// Live is false for a reference whose shim and QEMU are gone.
	Live bool
}

// refs reads the references of the layer hex.
func (c *Cache) refs(hex string) ([]RefState, error) {
	ents, err := os.ReadDir(c.refDir(hex))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	var out []RefState
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(c.refDir(hex), e.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("layer cache: %w", err)
		}
		var r Ref
		if json.Unmarshal(data, &r) != nil {
			// Unreadable: keep the layer, as for a live one.
			out = append(out, RefState{Ref: Ref{Name: e.Name()}, Live: true})
			continue
		}
		r.Name = e.Name()
		out = append(out, RefState{Ref: r, Live: c.alive(r)})
	}
	return out, nil
}

// liveRef reports whether the reference's shim still runs, or else its
// pod's QEMU (a shim that died leaves its VM until containerd's `shim
// delete` kills it).
func liveRef(r Ref) bool {
	if r.PID > 0 {
		if start, err := child.StartTime(r.PID); err == nil && start == r.Start {
			return true
		}
	}
	if r.StateDir == "" {
		return false
	}
	_, _, ok := statedir.QEMU("/proc", r.StateDir)
	return ok
}
