package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// SharedDir is where the guest mounts the pod's virtio-fs share.
const SharedDir = "/run/c8s/shared"

type shareState struct {
	mu      sync.Mutex
	mounted bool
}

// sharedMounts mounts the pod's share on first use and returns the guest
// paths of the request's shared host paths, keyed by host path.
func (s *Service) sharedMounts(req *agentapi.CreateContainerRequest) (map[string]string, error) {
	shared := req.GetSharedMounts()
	if len(shared) == 0 {
		return nil, nil
	}
	dir := s.cfg.SharedDir
	if dir == "" {
		return nil, fmt.Errorf("container %q has host paths shared over virtio-fs, but this agent has no shared directory: %w", req.GetContainerId(), errdefs.ErrFailedPrecondition)
	}
	if err := s.mountShare(dir); err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for _, m := range shared {
		name := m.GetName()
		if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
			return nil, fmt.Errorf("shared mount %q: bad name %q: %w", m.GetSource(), name, errdefs.ErrInvalidArgument)
		}
		p := filepath.Join(dir, name)
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, fmt.Errorf("shared mount of %s: %w", m.GetSource(), err)
		}
		// The host writes the share: a symlink there would make the bind
		// one of whatever guest path it names (/run/c8s/secrets), past the
		// pod's policy, which allows shared mounts by destination.
		if !fi.IsDir() && !fi.Mode().IsRegular() {
			what := "special file"
			if fi.Mode()&os.ModeSymlink != 0 {
				what = "symbolic link"
			}
			return nil, fmt.Errorf("shared mount of %s: entry %q of the share is a %s, not a directory or a regular file: %w", m.GetSource(), name, what, errdefs.ErrPermissionDenied)
		}
		paths[m.GetSource()] = p
	}
	return paths, nil
}

func (s *Service) mountShare(dir string) error {
	s.share.mu.Lock()
	defer s.share.mu.Unlock()
	if s.share.mounted {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mount := s.cfg.MountShared
	if mount == nil {
		mount = func(tag, target string) error { return unix.Mount(tag, target, "virtiofs", 0, "") }
	}
	if err := mount(agentapi.SharedFSTag, dir); err != nil {
		return fmt.Errorf("mount the pod's virtio-fs share %s on %s: %w", agentapi.SharedFSTag, dir, err)
	}
	s.share.mounted = true
	return nil
}
