package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/guest/rootfs"
	"github.com/c8s-dev/c8s/guest/spec"
)

// What a guest started as a TEE keeps from the host (Config.TEE, from the
// measured kernel command line; never from a request):
//
//   - Writes. A container's root disk is built by the host and read by it
//     at will. In a guest started as sim, snp or tdx the agent mounts it
//     read-only (and nodev) as the lower layer of an overlayfs whose upper
//     and work directories are on a tmpfs of the container's own
//     (writableRoot), in guest memory, which SNP and TDX encrypt: nothing
//     the container writes reaches the disk. The tmpfs is as large as the
//     container's memory limit (its pages are charged to the container's
//     memory cgroup anyway), or Config.ScratchSize without one, and goes
//     with the container (cleanup). A guest without c8s.tee mounts the
//     disk as the host asks, read-write.
//   - emptyDir volumes. A bind of a kubelet emptyDir becomes a directory
//     of the pod's emptyDir tmpfs (Config.EmptyDirDir), shared by the
//     pod's containers and kept for the pod VM's life as the kubelet
//     keeps an emptyDir for the pod's (container restarts keep it), never
//     the host's path nor a virtio-fs share (guest/spec EmptyDirVolume).
//   - The zero launch digest. In a guest started as snp or tdx whose
//     HOST_DATA or MRCONFIGID is zero (no init data measured), the agent
//     enforces policyapi.ZeroLaunchDefault from the first request, and
//     SetInitData cannot replace it (the only init data with that digest
//     is the empty document).

// DefaultScratchSize is Config.ScratchSize and EmptyDirSize unless set: half
// of the guest's RAM, tmpfs's own default. The pod VM is sized from its
// containers' limits; a container without one can fill at most this much
// before its writes fail with ENOSPC (memory it uses otherwise is bounded
// by the VM alone, as on a node).
const DefaultScratchSize = "50%"

// tmpfsSize is what ValidTmpfsSize accepts.
var tmpfsSize = regexp.MustCompile(`^[1-9][0-9]{0,18}[kKmMgG%]?$`)

// ValidTmpfsSize reports whether v is a size tmpfs takes for Config.
// ScratchSize or EmptyDirSize: bytes with an optional k, m or g, or a
// percentage of the guest's RAM ("50%").
func ValidTmpfsSize(v string) bool { return tmpfsSize.MatchString(v) }

// confidentialWrites reports whether containers' writes and emptyDirs stay
// in guest memory: in a guest started as a TEE, sim included.
func (s *Service) confidentialWrites() bool { return teeparam.Known(s.cfg.TEE) }

// hardwareTEE reports whether the guest was started as snp or tdx, whose
// host is the adversary.
func (s *Service) hardwareTEE() bool {
	return s.cfg.TEE == teeparam.SNP || s.cfg.TEE == teeparam.TDX
}

// rootfsTypes are the file systems a container's root disk may hold: what
// the shim builds (ext4) and read-only images (erofs).
var rootfsTypes = []string{"ext4", "erofs"}

// checkRootfs refuses a root disk request with another file system type
// than rootfsTypes, or with a mount option that is not a plain flag
// (guest/rootfs's flag options: ro, rw, nodev, noatime, ...). A data
// option is refused, and with it any file system that takes its "device"
// from its options: overlayfs asked to stack
// lowerdir=/run/c8s/secrets:<another container's upper> would hand a
// container the pod's secrets and other containers' writes, past the
// policy, which never sees the root's mount.
func checkRootfs(id string, r *agentapi.Rootfs) error {
	if !slices.Contains(rootfsTypes, r.GetFstype()) {
		return fmt.Errorf("container %q: root file system type %q: not allowed (allowed: %s): %w", id, r.GetFstype(), strings.Join(rootfsTypes, ", "), errdefs.ErrPermissionDenied)
	}
	for _, o := range r.GetOptions() {
		if _, data := rootfs.ParseOptions([]string{o}); data != "" {
			return fmt.Errorf("container %q: root mount option %q: not allowed (only mount flags such as ro, noatime, nodev are): %w", id, o, errdefs.ErrPermissionDenied)
		}
	}
	return nil
}

// Paths in a container's bundle (confidential writes).
const (
	lowerDir   = "lower"   // the host's disk, read-only
	scratchDir = "scratch" // the container's tmpfs: upper/ and work/
)

// mountRoot mounts the container's root filesystem on c.rootfs: an
// overlay of its image layers (layers.go), or the host's disk, in a guest
// started as a TEE as the lower layer of an overlay under a guest tmpfs.
func (s *Service) mountRoot(ctx context.Context, c *container, r *agentapi.Rootfs, spec *specs.Spec) error {
	if len(r.GetLayers()) > 0 {
		return s.layeredRoot(ctx, c, r, spec)
	}
	if emptyRoot(r) {
		return s.pulledRoot(ctx, c, spec) // pull.go
	}
	if err := checkRootfs(c.id, r); err != nil {
		return err
	}
	if !s.confidentialWrites() {
		return s.cfg.MountRootfs(ctx, r, c.rootfs)
	}
	return s.writableRoot(ctx, c, r, spec)
}

// writableRoot mounts the host's disk read-only at <bundle>/lower and
// stacks the container's writable layer over it (stackRoot).
func (s *Service) writableRoot(ctx context.Context, c *container, r *agentapi.Rootfs, spec *specs.Spec) error {
	lower := filepath.Join(c.bundle, lowerDir)
	if err := overlayPath(c.id, lower); err != nil {
		return err
	}
	ro := proto.Clone(r).(*agentapi.Rootfs)
	// Last, so that they win over any "rw" or "dev" of the host's.
	ro.Options = append(slices.Clone(r.GetOptions()), "ro", "nodev")
	if err := s.cfg.MountRootfs(ctx, ro, lower); err != nil {
		return err
	}
	return s.stackRoot(ctx, c, []string{lower}, spec, nil)
}

// overlayPath refuses a path that overlayfs options could not carry.
func overlayPath(id, p string) error {
	// The overlay's options separate paths with ',' and ':'.
	if strings.ContainsAny(p, ",:\\") {
		return fmt.Errorf("container %q: the path %s holds a character overlayfs options cannot carry (',', ':', '\\'): %w", id, p, errdefs.ErrInvalidArgument)
	}
	return nil
}

// stackRoot mounts a tmpfs at <bundle>/scratch and, on c.rootfs, the
// overlay of its upper and work directories over lowers (the top layer
// first): the container's writes stay in guest memory, which SNP and TDX
// encrypt. Each name in whiteouts (an entry of the root directory) is
// hidden by a whiteout in the upper directory.
func (s *Service) stackRoot(ctx context.Context, c *container, lowers []string, spec *specs.Spec, whiteouts []string) error {
	scratch := filepath.Join(c.bundle, scratchDir)
	upper, work := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work")
	for _, p := range append([]string{upper, work, c.rootfs}, lowers...) {
		if err := overlayPath(c.id, p); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return err
	}
	size := scratchSize(spec, s.cfg.ScratchSize)
	if err := unix.Mount("c8s-scratch", scratch, "tmpfs", 0, "mode=0700,size="+size); err != nil {
		return fmt.Errorf("mount the tmpfs of container %q's writable layer (size=%s): %w", c.id, size, err)
	}
	// The overlay's root takes the upper directory's owner and mode: the
	// image's top layer's.
	var st unix.Stat_t
	if err := unix.Stat(lowers[0], &st); err != nil {
		return fmt.Errorf("container %q: %w", c.id, err)
	}
	if err := os.Mkdir(upper, 0o700); err != nil {
		return err
	}
	if err := unix.Chown(upper, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("container %q: own the writable layer: %w", c.id, err)
	}
	if err := unix.Chmod(upper, st.Mode&0o7777); err != nil {
		return fmt.Errorf("container %q: mode of the writable layer: %w", c.id, err)
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return err
	}
	for _, name := range whiteouts {
		// overlayfs's whiteout: a character device 0/0.
		if err := unix.Mknod(filepath.Join(upper, name), unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("container %q: hide /%s: %w", c.id, name, err)
		}
	}
	if s.cfg.LoadOverlay != nil {
		s.overlayOnce.Do(s.cfg.LoadOverlay)
	}
	if err := mountOverlay(c.rootfs, lowers, upper, work); err != nil {
		return fmt.Errorf("mount container %q's root: %w", c.id, err)
	}
	log.G(ctx).WithField("container", c.id).WithField("size", size).WithField("layers", len(lowers)).Debug("writable layer in guest memory")
	return nil
}

// mountOverlay mounts an overlay of lowers (the top first), upper and work
// on target, nodev, through the new mount API: each lower directory is one
// "lowerdir+" parameter, so that a deep image is not cut at the page that
// mount(2)'s option string fits in.
func mountOverlay(target string, lowers []string, upper, work string) (err error) {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fd)
	defer func() {
		if err != nil {
			if msg := fsContextLog(fd); msg != "" {
				err = fmt.Errorf("%w (%s)", err, msg)
			}
		}
	}()
	set := func(k, v string) error {
		if err := unix.FsconfigSetString(fd, k, v); err != nil {
			return fmt.Errorf("overlay %s=%s: %w", k, v, err)
		}
		return nil
	}
	for _, l := range lowers {
		if err := set("lowerdir+", l); err != nil {
			return err
		}
	}
	if err := set("upperdir", upper); err != nil {
		return err
	}
	if err := set("workdir", work); err != nil {
		return err
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("overlay of %d layers: %w", len(lowers), err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("fsmount overlay: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move the overlay to %s: %w", target, err)
	}
	return nil
}

// fsContextLog reads the messages the kernel left on a file system
// context: why a parameter or the creation failed.
func fsContextLog(fd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for range 16 {
		n, err := unix.Read(fd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	return strings.Join(msgs, "; ")
}

// scratchSize is the size of a container's writable layer: its memory
// limit, or def.
func scratchSize(spec *specs.Spec, def string) string {
	if spec != nil && spec.Linux != nil && spec.Linux.Resources != nil && spec.Linux.Resources.Memory != nil {
		if l := spec.Linux.Resources.Memory.Limit; l != nil && *l > 0 {
			return strconv.FormatInt(*l, 10)
		}
	}
	return def
}

// emptyDirRoot is the directory guest/spec places emptyDir volumes under,
// or "" when they are host paths like any other.
func (s *Service) emptyDirRoot() string {
	if !s.confidentialWrites() {
		return ""
	}
	return s.cfg.EmptyDirDir
}

// makeEmptyDirs mounts the pod's emptyDir tmpfs on first use and creates
// the volumes' directories in it (mode 0777, as the kubelet makes them);
// an existing one is the pod's, kept.
func (s *Service) makeEmptyDirs(dirs []string) error {
	if len(dirs) == 0 {
		return nil
	}
	root := s.cfg.EmptyDirDir
	s.emptyDirs.mu.Lock()
	if !s.emptyDirs.mounted {
		if err := os.MkdirAll(root, 0o711); err != nil {
			s.emptyDirs.mu.Unlock()
			return err
		}
		if err := unix.Mount("c8s-emptydir", root, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, "mode=0711,size="+s.cfg.EmptyDirSize); err != nil {
			s.emptyDirs.mu.Unlock()
			return fmt.Errorf("mount the pod's emptyDir tmpfs on %s: %w", root, err)
		}
		s.emptyDirs.mounted = true
	}
	s.emptyDirs.mu.Unlock()
	for _, d := range dirs {
		if filepath.Dir(filepath.Dir(d)) != filepath.Clean(root) {
			return fmt.Errorf("emptyDir %s is not below %s", d, root)
		}
		if err := os.Mkdir(filepath.Dir(d), 0o711); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		mode := os.FileMode(0o777)
		if d == filepath.Join(root, spec.PodShm) {
			mode = 0o777 | os.ModeSticky // as /dev/shm
		}
		if err := os.Mkdir(d, mode); errors.Is(err, os.ErrExist) {
			continue
		} else if err != nil {
			return err
		}
		if err := os.Chmod(d, mode); err != nil { // past the umask
			return err
		}
	}
	return nil
}

// zeroLaunchAgentPolicy is the agent policy of init data that says
// nothing: the standard devices only, no port-forward.
func zeroLaunchAgentPolicy() (initdata.AgentPolicy, error) {
	doc, err := initdata.Parse([]byte("version = \"" + initdata.Version + "\"\n"))
	if err != nil {
		return initdata.AgentPolicy{}, err
	}
	return doc.Agent, nil
}

// enforceZeroLaunch puts policyapi.ZeroLaunchDefault in force, unless a
// policy already is: the guest was started as snp or tdx and its launch
// digest is zero.
func (s *Service) enforceZeroLaunch() error {
	agentPolicy, err := zeroLaunchAgentPolicy()
	if err != nil {
		return fmt.Errorf("the built-in agent policy of a VM launched without init data: %w", err)
	}
	field := "HOST_DATA"
	if s.cfg.TEE == teeparam.TDX {
		field = "MRCONFIGID"
	}
	p := policyapi.ZeroLaunchDefault()
	p.Explain = fmt.Sprintf("this pod VM was started as %s and launched without init data (its %s is zero), so the agent enforces its built-in policy %s (guest/api/policy.ZeroLaunchDefault): launch the pod with measured init data whose [policy] allows this",
		s.cfg.TEE, field, p.Builtin)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.policySet {
		return nil
	}
	s.policy, s.policySet, s.zeroLaunch = agentPolicy, true, true
	s.eval = policy.New(p, logDenial)
	log.L.WithField("tee", s.cfg.TEE).WithField("policy", p.Builtin).Warn("launched without init data: no exec, no host logs or stdin, no guest or virtio-fs binds, no port-forward")
	return nil
}

// unmountAll unmounts everything mounted at or below dir, the deepest
// first (lazily where busy), and fails if anything is left: dir is then
// safe to remove without deleting what a mount holds (a host share's
// content, a disk's).
func unmountAll(dir string) error {
	dir = filepath.Clean(dir)
	below := func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != dir && !strings.HasPrefix(m.Mountpoint, dir+"/"), false
	}
	for range 8 { // stacked mounts come off one per pass
		ms, err := mountinfo.GetMounts(below)
		if err != nil {
			return err
		}
		if len(ms) == 0 {
			return nil
		}
		sort.Slice(ms, func(i, j int) bool {
			if a, b := strings.Count(ms[i].Mountpoint, "/"), strings.Count(ms[j].Mountpoint, "/"); a != b {
				return a > b
			}
			return ms[i].ID > ms[j].ID
		})
		for _, m := range ms {
			if err := rootfs.Unmount(m.Mountpoint); err != nil {
				return err
			}
		}
	}
	ms, err := mountinfo.GetMounts(below)
	if err != nil {
		return err
	}
	if len(ms) > 0 {
		return fmt.Errorf("%s is still mounted after unmounting everything below %s", ms[0].Mountpoint, dir)
	}
	return nil
}
