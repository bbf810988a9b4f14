package layercache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// lock takes the exclusive flock of the layer hex, waiting until it is
// free or ctx ends. Prune may remove a lock file under its lock, so a lock
// taken on a file no longer at its path is dropped and taken again.
func (c *Cache) lock(ctx context.Context, hex string) (unlock func(), err error) {
	p := filepath.Join(c.dir, locksDir, hex+".lock")
	for {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("layer cache: %w", err)
		}
		if err := flock(ctx, f, c.lockPoll); err != nil {
			f.Close()
			return nil, fmt.Errorf("layer cache: wait for the lock of layer sha256:%s: %w", hex, err)
		}
		if sameFile(f, p) {
			return func() { f.Close() }, nil
		}
		f.Close() // removed by Prune while we waited
	}
}

// flock takes f's exclusive lock, polling so that ctx can end the wait.
func flock(ctx context.Context, f *os.File, poll time.Duration) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

// sameFile reports whether the open f is still the file at path p.
func sameFile(f *os.File, p string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(p)
	return err == nil && os.SameFile(a, b)
}

// removeLock removes the layer's lock file. The caller holds the lock, so
// a waiter retries on a new file.
func (c *Cache) removeLock(hex string) {
	os.Remove(filepath.Join(c.dir, locksDir, hex+".lock"))
}
