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

	"github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/internal/child"
)

// A pod VM that migrates keeps its layer disks attached at the same
// addresses (launcher/migrate): the destination node takes a reference
// on its own cached copy of each layer (IncomingRef) before its QEMU
// opens them, and the source drops its pod's references once the VM runs
// there.

// IncomingRef is the reference a node's migration server (`c8s-launcher
// serve`, the calling process) holds on the layers of the pod VM id that
// migrated to it, whose state dir on this node is stateDir. Its name
// cannot collide with a PodRef's, so the same node may be both ends of a
// migration.
func IncomingRef(id, stateDir string) (Ref, error) {
	pid := os.Getpid()
	start, err := child.StartTime(pid)
	if err != nil {
		return Ref{}, fmt.Errorf("layer cache: read this process's start time: %w", err)
	}
	sum := sha256.Sum256([]byte("incoming\x00" + id))
	return Ref{Name: "in-" + hex.EncodeToString(sum[:12]), Pod: id, StateDir: stateDir, PID: pid, Start: start}, nil
}

// Ref returns the reference named name on the layer diffID, or an error
// wrapping fs.ErrNotExist.
func (c *Cache) Ref(diffID digest.Digest, name string) (Ref, error) {
	if err := checkDiffID(diffID); err != nil {
		return Ref{}, err
	}
	if err := (Ref{Name: name}).check(); err != nil {
		return Ref{}, err
	}
	data, err := os.ReadFile(filepath.Join(c.refDir(diffID.Encoded()), name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Ref{}, fmt.Errorf("layer cache: layer %s has no reference %q: %w", diffID, name, fs.ErrNotExist)
		}
		return Ref{}, fmt.Errorf("layer cache: %w", err)
	}
	var r Ref
	if err := json.Unmarshal(data, &r); err != nil {
		return Ref{}, fmt.Errorf("layer cache: reference %q of layer %s: %w", name, diffID, err)
	}
	r.Name = name
	return r, nil
}
