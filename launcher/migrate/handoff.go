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
// its VM runs now, so that cleaning up after a dead shim (`shim delete`)
// stops that VM too.
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

// StopHandedOff stops the VM a handoff file in dir names, if there is
// one, and removes the file. It reports whether there was one.
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
	if err := c.Delete(ctx, h.ID); err != nil {
		return true, fmt.Errorf("migrate: stopping the moved VM %s on %s: %w", h.ID, h.Destination, err)
	}
	return true, os.Remove(path)
}
