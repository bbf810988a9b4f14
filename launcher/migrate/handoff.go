package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// HandoffFile, in a moved pod's state dir on the source node, says where
// its VM runs now, or may run: it is written as soon as the destination
// has started the VM (before the transfer), so that cleaning up after a
// shim that died at any point from then on (`shim delete`) stops that VM
// too, and removed again when a migration that failed has destroyed it
// (ClearHandoff).
const HandoffFile = "migrated.json"

type handoff struct {
	Destination string `json:"destination"`
	ID          string `json:"id"`
	// TLSDir is the node's TLS identity for a tls:// destination
	// (statedir.MigrateTLS of its state dir, whose server relays to it).
	TLSDir string `json:"tls_dir,omitempty"`
}

// WriteHandoff records in dir that VM id now runs behind dst.
func WriteHandoff(dir string, dst *Client, id, tlsDir string) error {
	b, err := json.Marshal(handoff{Destination: dst.Address(), ID: id, TLSDir: tlsDir})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, HandoffFile), b, 0o600)
}

// ClearHandoff removes the handoff file in dir after a failed migration,
// once VM id behind dst is gone: it is destroyed again (a rollback has
// destroyed it already, normally; one already gone is fine). When that
// fails, the file stays, so that `shim delete` tries again.
func ClearHandoff(ctx context.Context, dir string, dst vmDeleter, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := dst.Delete(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("migrate: destroying VM %s after the failed migration (%s keeps naming it): %w", id, filepath.Join(dir, HandoffFile), err)
	}
	if err := os.Remove(filepath.Join(dir, HandoffFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// StopHandedOff stops the VM a handoff file in dir names, if there is
// one (one already gone is fine), and removes the file. It reports
// whether there was one.
func StopHandedOff(ctx context.Context, dir string) (bool, error) {
	path := filepath.Join(dir, HandoffFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return true, err
	}
	var h handoff
	if err := json.Unmarshal(b, &h); err != nil {
		return true, fmt.Errorf("migrate: %s: %w", path, err)
	}
	var c *Client
	if strings.HasPrefix(h.Destination, "tls://") {
		root := filepath.Dir(filepath.Dir(h.TLSDir))
		if h.TLSDir == "" || statedir.MigrateTLS(root) != filepath.Clean(h.TLSDir) {
			return true, fmt.Errorf("migrate: %s: TLS identity %q is not a node's (want <state_dir>/node/migrate-tls)", path, h.TLSDir)
		}
		if c, err = relayClient(statedir.MigrateSocket(root), strings.TrimPrefix(h.Destination, "tls://")); err != nil {
			return true, err
		}
	} else {
		c = NewClient(h.Destination)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Delete(ctx, h.ID); err != nil && !errors.Is(err, ErrNotFound) {
		return true, fmt.Errorf("migrate: stopping the moved VM %s on %s: %w", h.ID, h.Destination, err)
	}
	return true, os.Remove(path)
}
