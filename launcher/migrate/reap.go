package migrate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/internal/child"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// hold takes the node's migration server lock for a Serve call: the
// first takes it (lockIncoming), the others of the same server share it.
func (s *Server) hold(ctx context.Context) error {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if s.held == 0 {
		unlock, err := s.lockIncoming(ctx)
		if err != nil {
			return err
		}
		s.unlock = unlock
	}
	s.held++
	return nil
}

// unhold ends a Serve call's hold; the last releases the lock.
func (s *Server) unhold() {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if s.held--; s.held == 0 {
		s.unlock()
		s.unlock = nil
	}
}

// lockIncoming takes the node's migration server lock (statedir.
// MigrateLock) for as long as the server serves, and reaps what an
// earlier server left: the VMs that migrated in are the server's alone,
// their QEMUs die with it (vm.Spec.DieWithParent), and a server that
// starts again knows none of them. A second server on the same state dir
// is refused.
func (s *Server) lockIncoming(ctx context.Context) (unlock func(), err error) {
	root := s.Config.Runtime.StateDir
	lock := statedir.MigrateLock(root)
	if err := os.MkdirAll(filepath.Dir(lock), 0o700); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("migrate: another migration server serves the VMs of state dir %s (%s is locked): %w", root, lock, err)
	}
	reapIncoming(ctx, statedir.IncomingDir(root))
	return func() { f.Close() }, nil
}

// reapIncoming stops the QEMU of each VM state dir in dir, if one still
// runs there (of a server that did not have them die with it), and
// removes the dir: a later migration of the same pod would find it taken.
// Their layer references name the earlier server's process, and are dead
// with it (launcher/layercache prunes them).
func reapIncoming(ctx context.Context, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		vmDir := filepath.Join(dir, e.Name())
		l := log.G(ctx).WithField("state_dir", vmDir)
		if pid, _, ok := statedir.QEMU("/proc", vmDir); ok {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				l.WithField("pid", pid).Warn("migrate: stopped the QEMU of a VM an earlier server left")
			}
			for end := time.Now().Add(5 * time.Second); child.Running(pid) && time.Now().Before(end); {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if err := os.RemoveAll(vmDir); err != nil {
			l.WithError(err).Warn("migrate: remove the state dir of a VM an earlier server left")
			continue
		}
		l.Info("migrate: removed the state dir of a VM an earlier server left")
	}
}
