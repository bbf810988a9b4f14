package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/spec"
)

// SharedDir is where the guest mounts the pod's virtio-fs share.
const SharedDir = "/run/c8s/shared"

type shareState struct {
	mu      sync.Mutex
	mounted bool
}

// sharedMounts mounts the pod's share on first use, stages each of the
// request's shared host paths in the container's bundle (stageShares) and
// returns the staged paths, keyed by host path. In a guest that keeps
// emptyDirs in its memory, their shares are not used (guest/spec).
func (s *Service) sharedMounts(req *agentapi.CreateContainerRequest, bundle string) (map[string]string, error) {
	var shared []*agentapi.SharedMount
	for _, m := range req.GetSharedMounts() {
		if _, _, ok := spec.EmptyDirVolume(m.GetSource()); ok && s.emptyDirRoot() != "" {
			continue
		}
		if spec.SandboxShm(m.GetSource()) && s.emptyDirRoot() != "" {
			continue // the pod's /dev/shm is in guest memory (spec.PodShm)
		}
		shared = append(shared, m)
	}
	if len(shared) == 0 {
		return nil, nil
	}
	if err := s.evaluator().MountShare(req.GetContainerId()); err != nil {
		return nil, err
	}
	dir := s.cfg.SharedDir
	if dir == "" {
		return nil, fmt.Errorf("container %q has host paths shared over virtio-fs, but this agent has no shared directory: %w", req.GetContainerId(), errdefs.ErrFailedPrecondition)
	}
	if err := s.mountShare(dir); err != nil {
		return nil, err
	}
	subs := make([][]string, len(shared))
	for i, m := range shared {
		subs[i] = s.submountLookups(m)
	}
	return stageShares(dir, shared, subs, filepath.Join(bundle, "shares"), !s.evaluator().Governs())
}

// submountLookups returns the host's mounts below share m that the agent
// looks up before it stages m. None under a policy: there they are left
// to be mounted on first use, under the runtime's bind, so that a volume
// the policy requires read-only is read-only all the way down, whatever
// the host announces below it (a writable mount there would be an outlet
// the policy's read_only closes). Without a policy a read-only volume is
// read-only at its top only, as CRI asks.
func (s *Service) submountLookups(m *agentapi.SharedMount) []string {
	if s.evaluator().Governs() {
		return nil
	}
	return m.GetSubmounts()
}

// flattenShared makes the runtime's binds of staged shares (origin
// spec.OriginShared) binds of the staged mount alone, under a policy:
// not recursive ("bind" for "rbind", and the propagation options without
// their r-, which crun ORs into the bind as MS_REC), so that whatever is
// mounted below the staged copy after its stage (stageShares leaves out
// what was there before) is not carried into the container. And it
// makes the bind's flags recursive ("rro" with "ro", "rnosuid",
// "rnodev"), applied right after the bind, before the runtime walks
// through it to a nested destination: a share entry's submount the guest
// mounts then, or later, on first use, takes the bind's flags, so a
// volume the policy requires read-only is read-only all the way down.
func flattenShared(mounts []specs.Mount, origins []spec.MountOrigin) {
	flat := map[string]string{"rbind": "bind", "rprivate": "private", "rslave": "slave", "rshared": "shared", "runbindable": "unbindable"}
	for i := range mounts {
		if i >= len(origins) || origins[i] != spec.OriginShared {
			continue
		}
		opts := mounts[i].Options[:0:0]
		for _, o := range mounts[i].Options {
			if f, ok := flat[o]; ok {
				o = f
			}
			opts = append(opts, o)
		}
		if slices.Contains(opts, "ro") {
			opts = append(opts, "rro")
		}
		mounts[i].Options = append(opts, "rnosuid", "rnodev")
	}
}

// stageShares pins each share entry where the runtime will bind it from.
// The host (virtiofsd) writes the share and can swap an entry at any
// time, for a symlink to / or /run/c8s/secrets say, which a bind by path
// would follow. So each entry is opened once without following a
// symlink (O_PATH|O_NOFOLLOW, below the share's root), checked on that
// file descriptor (a directory or a regular file, nothing else), cloned
// from it as a detached mount (open_tree OPEN_TREE_CLONE) and attached at
// stage/<name> in the container's bundle; the runtime binds that path,
// which no later change on the host can redirect. cleanup unmounts the
// staged mounts with the bundle. The clone is recursive (AT_RECURSIVE,
// the mounts below the entry too) only without a policy: under one a
// mount found below the entry in the agent's namespace is the host's
// doing (a walk it directed there mounts a virtio-fs submount, writable)
// and is left out of the container's read-only volume.
func stageShares(dir string, shared []*agentapi.SharedMount, submounts [][]string, stage string, recursive bool) (map[string]string, error) {
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the pod's share %s: %w", dir, err)
	}
	defer unix.Close(root)
	if err := os.MkdirAll(stage, 0o700); err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for i, m := range shared {
		name := m.GetName()
		if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
			return nil, fmt.Errorf("shared mount %q: bad name %q: %w", m.GetSource(), name, errdefs.ErrInvalidArgument)
		}
		target, err := stageShare(root, name, submounts[i], stage, recursive)
		if err != nil {
			return nil, fmt.Errorf("shared mount of %s: %w", m.GetSource(), err)
		}
		paths[m.GetSource()] = target
	}
	return paths, nil
}

// stageShare stages entry name of the share open at root below stage. A
// directory is staged from the mount virtio-fs stacks on the entry (the
// host's bind of it), with the host's mounts below it looked up first
// (submounts): the guest mounts each on its first lookup, under the mount
// it is reached through then, and reached through the runtime's read-only
// bind it would be read-only too, where a bind that is not recursive
// leaves it as the host has it.
func stageShare(root int, name string, submounts []string, stage string, recursive bool) (string, error) {
	fd, err := unix.Openat(root, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open entry %q of the share: %w", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("stat entry %q of the share: %w", name, err)
	}
	target := filepath.Join(stage, name)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := os.Mkdir(target, 0o700); err != nil {
			return "", err
		}
		// Into the mount on the entry; still never through a symlink.
		dir, err := unix.Openat(root, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("open directory %q of the share: %w", name, err)
		}
		defer unix.Close(dir)
		fd = dir
		lookUpSubmounts(dir, submounts)
	case unix.S_IFREG:
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return "", err
		}
		f.Close()
	default:
		// A symlink would make the bind one of whatever guest path it
		// names (/run/c8s/secrets), past the pod's policy, which allows
		// shared mounts by destination.
		what := "special file"
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			what = "symbolic link"
		}
		return "", fmt.Errorf("entry %q of the share is a %s, not a directory or a regular file: %w", name, what, errdefs.ErrPermissionDenied)
	}
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_EMPTY_PATH
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	tree, err := unix.OpenTree(fd, "", uint(flags))
	if err != nil {
		return "", fmt.Errorf("clone entry %q of the share: %w", name, err)
	}
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return "", fmt.Errorf("stage entry %q of the share at %s: %w", name, target, err)
	}
	return target, nil
}

// maxSubmounts bounds the submounts looked up for one shared directory.
const maxSubmounts = 64

// lookUpSubmounts looks up each of the host's mount points below the
// shared directory open at dir, which mounts it (virtio-fs announces it).
// The names are the host's: each must be a clean relative path, and is
// resolved below dir without a symlink. A lookup that fails only leaves
// that mount to be mounted later, as it would be without this.
func lookUpSubmounts(dir int, submounts []string) []string {
	var done []string
	for _, p := range submounts[:min(len(submounts), maxSubmounts)] {
		if p == "" || len(p) > 4096 || filepath.IsAbs(p) || filepath.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
			continue
		}
		fd, err := unix.Openat2(dir, p, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			continue
		}
		unix.Close(fd)
		done = append(done, p)
	}
	return done
}

// testHookSharesStaged, when set, runs once a create has staged its
// shares, before the runtime binds them (tests: a host swapping an
// entry then).
var testHookSharesStaged func()

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
		// The host serves the share: its setuid bits and device nodes mean
		// nothing in the pod. The containers' binds of its entries say so
		// themselves (spec sharedOptions): crun remounts a bind with the
		// spec's flags alone.
		mount = func(tag, target string) error {
			return unix.Mount(tag, target, "virtiofs", unix.MS_NOSUID|unix.MS_NODEV, "")
		}
	}
	if err := mount(agentapi.SharedFSTag, dir); err != nil {
		return fmt.Errorf("mount the pod's virtio-fs share %s on %s: %w", agentapi.SharedFSTag, dir, err)
	}
	s.share.mounted = true
	return nil
}
