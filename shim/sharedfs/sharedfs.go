// Package sharedfs shares host directories (containers' host-path bind
// mounts) with a pod VM over virtio-fs: one virtiofsd per pod serves a
// per-pod directory, and each shared host path is bind-mounted into it
// under a name the guest agent then binds into the container. virtiofsd
// runs with sandbox=chroot in the shim's mount namespace, so mounts added
// after it started are visible to it (and the guest) at once.
package sharedfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/internal/child"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// Tag is the virtio-fs tag the guest mounts.
const Tag = agent.SharedFSTag

// Names of the files in a Share's directory.
const (
	SocketName = "virtiofsd.sock"
	sharedName = "shared"
	logName    = "virtiofsd.log"
)

// startTimeout bounds the wait for virtiofsd's socket.
const startTimeout = 10 * time.Second

// Share is a running virtiofsd and the directory it serves.
type Share struct {
	dir  string
	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	mounts map[string]bool // names bind-mounted in the shared directory
}

// Start creates dir (its shared subdirectory is what the guest sees) and
// starts daemon (virtiofsd) serving it on dir/virtiofsd.sock. On error
// nothing is left behind.
func Start(ctx context.Context, daemon, dir string) (_ *Share, retErr error) {
	if daemon == "" {
		return nil, errors.New("sharedfs: no virtiofsd configured (hypervisor.virtio_fs_daemon)")
	}
	if _, err := os.Stat(daemon); err != nil {
		return nil, fmt.Errorf("sharedfs: hypervisor.virtio_fs_daemon: %w (Debian 12: /usr/lib/qemu/virtiofsd from qemu-system-common)", err)
	}
	if sock := filepath.Join(dir, SocketName); len(sock) > statedir.UnixPathMax {
		return nil, fmt.Errorf("sharedfs: %s is too long for a unix socket (%d > %d bytes): use a shorter runtime.state_dir (at most %d bytes)", sock, len(sock), statedir.UnixPathMax, statedir.MaxRoot)
	}
	shared := filepath.Join(dir, sharedName)
	if err := os.MkdirAll(shared, 0o700); err != nil {
		return nil, fmt.Errorf("sharedfs: %w", err)
	}
	s := &Share{dir: dir, done: make(chan struct{}), mounts: map[string]bool{}}
	defer func() {
		if retErr != nil {
			s.Close()
		}
	}()
	logf, err := os.Create(filepath.Join(dir, logName))
	if err != nil {
		return nil, fmt.Errorf("sharedfs: %w", err)
	}
	defer logf.Close()
	sock := s.Socket()
	s.cmd = exec.Command(daemon, "--socket-path="+sock, "-o", "source="+shared,
		"-o", "sandbox=chroot", "-o", "cache=auto", "-o", "announce_submounts")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// It dies with the shim: virtiofsd exits when its QEMU goes, but
	// not before one has connected, and a shim killed before its QEMU
	// did would leave it waiting for ever.
	if err := child.Start(s.cmd, true, func() { s.cmd.Wait(); close(s.done) }); err != nil {
		close(s.done)
		return nil, fmt.Errorf("sharedfs: start %s: %w", daemon, err)
	}
	deadline := time.Now().Add(startTimeout)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("sharedfs: %s exited before listening: %s", daemon, tailOf(filepath.Join(dir, logName)))
		case <-ctx.Done():
			return nil, fmt.Errorf("sharedfs: waiting for %s: %w", daemon, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("sharedfs: %s did not create %s within %s: %s", daemon, sock, startTimeout, tailOf(filepath.Join(dir, logName)))
		}
	}
	log.G(ctx).WithField("pid", s.cmd.Process.Pid).WithField("dir", shared).Debug("virtiofsd started")
	return s, nil
}

// Socket is the vhost-user socket QEMU connects to.
func (s *Share) Socket() string { return filepath.Join(s.dir, SocketName) }

// Add bind-mounts hostPath (a directory or file) into the shared directory
// as name, read-only if asked; the guest finds it at <mount of Tag>/name.
func (s *Share) Add(hostPath, name string, readOnly bool) error {
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return fmt.Errorf("sharedfs: bad share name %q", name)
	}
	fi, err := os.Stat(hostPath)
	if err != nil {
		return fmt.Errorf("sharedfs: host path: %w", err)
	}
	target := filepath.Join(s.dir, sharedName, name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mounts[name] {
		return fmt.Errorf("sharedfs: %s is already shared", name)
	}
	if fi.IsDir() {
		err = os.Mkdir(target, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("sharedfs: mount point for %s: %w", hostPath, err)
	}
	if err := unix.Mount(hostPath, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		os.Remove(target)
		return fmt.Errorf("sharedfs: bind %s: %w", hostPath, err)
	}
	s.mounts[name] = true
	if readOnly {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			s.removeLocked(name)
			return fmt.Errorf("sharedfs: make %s read-only: %w", hostPath, err)
		}
	}
	return nil
}

// Remove unmounts a shared path and removes its mount point.
func (s *Share) Remove(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(name)
}

func (s *Share) removeLocked(name string) error {
	if !s.mounts[name] {
		return nil
	}
	target := filepath.Join(s.dir, sharedName, name)
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("sharedfs: unmount %s: %w", target, err)
	}
	delete(s.mounts, name)
	return os.Remove(target)
}

// Close stops virtiofsd, unmounts every shared path and removes the
// directory. It is idempotent.
func (s *Share) Close() error {
	if s.cmd != nil && s.cmd.Process != nil {
		select {
		case <-s.done:
		default:
			syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
	}
	s.mu.Lock()
	names := make([]string, 0, len(s.mounts))
	for n := range s.mounts {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, n := range names {
		if err := s.removeLocked(n); err != nil {
			errs = append(errs, err)
		}
	}
	s.mu.Unlock()
	if len(errs) > 0 {
		// Never RemoveAll through a mount: that would delete host files.
		return errors.Join(errs...)
	}
	return os.RemoveAll(s.dir)
}

func tailOf(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 2048 {
		data = data[len(data)-2048:]
	}
	return string(data)
}

// Cleanup undoes what a Share left in dir when its shim died: it detaches
// every path still mounted in the shared directory, then removes dir. A
// virtiofsd still running exits with its QEMU.
func Cleanup(dir string) error {
	shared := filepath.Join(dir, sharedName)
	entries, err := os.ReadDir(shared)
	if errors.Is(err, os.ErrNotExist) {
		return os.RemoveAll(dir)
	}
	if err != nil {
		return fmt.Errorf("sharedfs: %w", err)
	}
	var errs []error
	for _, e := range entries {
		target := filepath.Join(shared, e.Name())
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("sharedfs: unmount %s: %w", target, err))
			continue
		}
		if err := os.Remove(target); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// Never RemoveAll through a mount: that would delete host files.
		return errors.Join(errs...)
	}
	return os.RemoveAll(dir)
}
