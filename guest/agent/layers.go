package agent

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	verityapi "github.com/c8s-dev/c8s/guest/api/verity"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/guest/rootfs"
	"github.com/c8s-dev/c8s/guest/verity"
)

// A container's root from image layers (Rootfs.layers): the host attaches
// each layer once per pod as a read-only disk in c8s's layer format
// (ext4, then its dm-verity tree; guest/api/verity.Layer) and names the
// disks, bottom layer first. The guest
//
//   - opens each disk through dm-verity, as /dev/mapper/c8s-layer-<hex>,
//     with the root hash and data blocks of the pod's policy where the
//     container's rule pins its layers (guest/policy refuses a request
//     whose layers or roots differ from the rule's), else with the host's
//     (nothing is pinned: no policy, a rule without layers, the built-in
//     policy of a VM launched without init data);
//   - mounts it ext4 ro,nodev,nosuid at <LayersDir>/<hex>, once for every
//     container of the pod that uses the layer, counting them; the last
//     container's removal unmounts it and removes its mapping. One digest
//     is never open with two roots: a container asking for another root
//     than the open one is refused;
//   - stacks the layers with overlayfs, top first, under the container's
//     writable layer in guest memory (stackRoot), TEE or not: there is no
//     writable disk of the host's in this mode.
//
// A block the host changed fails to read with EIO, and dm-verity marks the
// mapping corrupted (status "C", sticky). The guest looks at that status
// whenever a container of the layer fails to create, start or exec, when
// its process exits, and before it creates, starts or execs in a container
// of a layer: the refusal, and the guest's log, name the layer's digest
// (LayerCorruptedError).
//
// Paths and device names come only from the validated hex of a digest, so
// that nothing the host writes reaches a mount's options.

// MaxLayers is the most layers a container's root may stack. Docker and
// BuildKit refuse to build images of more than 127 layers; overlayfs takes
// up to 500 lower layers, and each layer is a disk of the pod's
// virtio-scsi controller.
const MaxLayers = 127

// maxLayerBlocks bounds a layer's data blocks (16 TiB), so that its size in
// sectors cannot overflow.
const maxLayerBlocks = 1 << 32

// layerDiskWait bounds the wait for a hot-plugged layer disk to appear.
const layerDiskWait = 10 * time.Second

// LayerDevices finds and maps layer disks: the guest's are
// GuestLayerDevices; tests fake them.
type LayerDevices interface {
	// Find returns the block device of the disk at a SCSI address.
	Find(ctx context.Context, disk *agentapi.ScsiDisk) (string, error)
	// Open maps p.Device through a read-only dm-verity target named name
	// and returns the mapped device.
	Open(name string, p verityapi.Params) (string, error)
	// Close removes the mapping.
	Close(name string) error
	// Corrupted reports whether dm-verity found a block of the mapping
	// that does not verify.
	Corrupted(name string) (bool, error)
}

// GuestLayerDevices are the guest's: disks of the virtio-scsi controller
// under /sys and /dev, dm-verity through /dev/mapper/control.
type GuestLayerDevices struct{}

// Find waits for the disk at the address.
func (GuestLayerDevices) Find(ctx context.Context, d *agentapi.ScsiDisk) (string, error) {
	return rootfs.FindSCSIDisk(ctx, "/sys", "/dev", d.GetTarget(), d.GetLun(), layerDiskWait)
}

// Open maps the disk with guest/verity.
func (GuestLayerDevices) Open(name string, p verityapi.Params) (string, error) {
	d, err := verity.Open(name, p, "/dev", 5*time.Second)
	if err != nil {
		return "", err
	}
	return d.Path, nil
}

// Close removes the mapping.
func (GuestLayerDevices) Close(name string) error { return verity.Remove(name) }

// Corrupted reads the verity target's status.
func (GuestLayerDevices) Corrupted(name string) (bool, error) { return verity.Corrupted(name) }

// LayerCorruptedError says that a layer's disk does not verify against its
// dm-verity root: a block of it was read and did not match.
type LayerCorruptedError struct {
	// Digest is the layer's diff ID, RootHash the root it was opened with.
	Digest, RootHash string
	// Disk is its SCSI address.
	Disk string
	// Containers are those that use it.
	Containers []string
}

func (e *LayerCorruptedError) Error() string {
	return fmt.Sprintf("layer %s failed dm-verity verification: a block of its disk (scsi %s) does not match root hash %s, so reads of it fail (containers using it: %s): the layer's disk on the host was changed, or another disk attached in its place",
		e.Digest, e.Disk, e.RootHash, strings.Join(e.Containers, ", "))
}

// Unwrap makes it errdefs.ErrDataLoss.
func (e *LayerCorruptedError) Unwrap() error { return errdefs.ErrDataLoss }

// layerRequest is one layer of a request, validated.
type layerRequest struct {
	digest string // sha256:<hex>
	hex    string
	disk   *agentapi.ScsiDisk
	root   string
	blocks uint64
}

// rootOf validates a CreateContainer's root and returns it as the policy
// judges it: a disk the host built, or layers. Malformed layers are
// refused before anything of them is used.
func rootOf(id string, r *agentapi.Rootfs) (policy.Root, []layerRequest, error) {
	if len(r.GetLayers()) == 0 {
		if emptyRoot(r) {
			// No root offered: the guest pulls the image its rule names
			// (pull.go), or the policy refuses.
			return policy.Root{Empty: true}, nil, nil
		}
		if r.GetSource() == nil {
			return policy.Root{}, nil, fmt.Errorf("container %q: the rootfs names neither a disk nor layers: %w", id, errdefs.ErrInvalidArgument)
		}
		return policy.Root{HostDisk: true}, nil, nil
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("container %q: rootfs: %s: %w", id, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	if r.GetSource() != nil {
		return policy.Root{}, nil, bad("both a disk and layers: a root is one or the other")
	}
	if t := r.GetFstype(); t != "" && t != "ext4" {
		return policy.Root{}, nil, bad("file system type %q: layer disks are ext4", t)
	}
	for _, o := range r.GetOptions() {
		if _, data := rootfs.ParseOptions([]string{o}); data != "" {
			return policy.Root{}, nil, bad("option %q: not allowed (layers are mounted ro,nodev,nosuid)", o)
		}
	}
	if n := len(r.GetLayers()); n > MaxLayers {
		return policy.Root{}, nil, bad("%d layers: at most %d are stacked", n, MaxLayers)
	}
	var root policy.Root
	var reqs []layerRequest
	for i, l := range r.GetLayers() {
		h, ok := strings.CutPrefix(l.GetDigest(), "sha256:")
		if !ok || !lowerHex(h, 32) {
			return policy.Root{}, nil, bad("layers[%d].digest %q is not a diff ID (sha256:<64 lower-case hex digits>)", i, l.GetDigest())
		}
		if !lowerHex(l.GetRootHash(), 32) {
			return policy.Root{}, nil, bad("layers[%d].root_hash %q is not a dm-verity root (64 lower-case hex digits)", i, l.GetRootHash())
		}
		if b := l.GetDataBlocks(); b == 0 || b > maxLayerBlocks {
			return policy.Root{}, nil, bad("layers[%d].data_blocks %d: not between 1 and %d", i, b, uint64(maxLayerBlocks))
		}
		if l.GetScsi() == nil {
			return policy.Root{}, nil, bad("layers[%d] (%s) names no disk", i, l.GetDigest())
		}
		root.Layers = append(root.Layers, policyapi.Layer{Digest: l.GetDigest(), Verity: l.GetRootHash(), Blocks: l.GetDataBlocks()})
		reqs = append(reqs, layerRequest{digest: l.GetDigest(), hex: h, disk: l.GetScsi(), root: l.GetRootHash(), blocks: l.GetDataBlocks()})
	}
	return root, reqs, nil
}

// lowerHex reports whether s is n bytes in lower-case hex.
func lowerHex(s string, n int) bool {
	if len(s) != 2*n || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// pinLayers gives each layer the root hash and blocks that the container's
// rule pins for it (PinnedLayers, matched by position and digest): the
// policy's, never the host's. What the rule does not pin keeps the host's.
func pinLayers(ctx context.Context, id string, reqs []layerRequest, pinned []policyapi.Layer) []layerRequest {
	out := slices.Clone(reqs)
	unpinned := 0
	for i := range out {
		if i < len(pinned) && pinned[i].Digest == out[i].digest {
			out[i].root, out[i].blocks = pinned[i].Verity, pinned[i].Blocks
			continue
		}
		unpinned++
	}
	if unpinned > 0 {
		log.G(ctx).WithField("container", id).WithField("layers", unpinned).
			Debug("the pod's policy pins none of these layers: opening them with the host's dm-verity roots")
	}
	return out
}

// layer is one layer disk opened in the guest.
type layer struct {
	digest, hex string
	root        string
	blocks      uint64
	disk        string // its SCSI address, "target:lun"
	dm          string // device-mapper name
	device      string // the mapped device
	dir         string // where it is mounted
	dmOpen      bool
	mounted     bool
	users       map[string]bool // the containers using it
	corrupt     *LayerCorruptedError
}

// layerStore holds the pod's open layers, by digest hex. One mutex
// serializes opening and closing them.
type layerStore struct {
	mu       sync.Mutex
	layers   map[string]*layer
	loadOnce sync.Once
}

// layerDevices returns the devices layers are opened with.
func (s *Service) layerDevices() LayerDevices {
	if s.cfg.LayerDevices != nil {
		return s.cfg.LayerDevices
	}
	return GuestLayerDevices{}
}

// layersDir is where layers are mounted.
func (s *Service) layersDir() string {
	if s.cfg.LayersDir != "" {
		return s.cfg.LayersDir
	}
	return filepath.Join(filepath.Dir(filepath.Clean(s.cfg.StateDir)), "layers")
}

// acquireLayers opens the container's layers, or takes those already open,
// and returns them in the order asked (a layer named twice, twice). On
// error nothing is held.
func (s *Service) acquireLayers(ctx context.Context, id string, reqs []layerRequest) ([]*layer, error) {
	st := &s.layers
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.layers == nil {
		st.layers = map[string]*layer{}
	}
	var held []*layer
	fail := func(err error) ([]*layer, error) {
		s.releaseLocked(ctx, id, held)
		return nil, err
	}
	for i, r := range reqs {
		l := st.layers[r.hex]
		if l != nil && slices.Contains(held, l) {
			// The same layer twice in one image: opened once.
			if l.root != r.root || l.blocks != r.blocks {
				return fail(fmt.Errorf("container %q: layers[%d] %s is named twice with different dm-verity roots (%s, %d blocks and %s, %d blocks): %w",
					id, i, r.digest, l.root, l.blocks, r.root, r.blocks, errdefs.ErrInvalidArgument))
			}
			held = append(held, l)
			continue
		}
		if l == nil {
			l = &layer{digest: r.digest, hex: r.hex, root: r.root, blocks: r.blocks,
				disk: fmt.Sprintf("%d:%d", r.disk.GetTarget(), r.disk.GetLun()),
				dm:   "c8s-layer-" + r.hex, dir: filepath.Join(s.layersDir(), r.hex), users: map[string]bool{}}
			st.layers[r.hex] = l
		} else if l.root != r.root || l.blocks != r.blocks {
			return fail(fmt.Errorf("container %q: layers[%d] %s with dm-verity root %s (%d blocks): the layer is open with root %s (%d blocks) for %s, and one digest is never opened with two roots: %w",
				id, i, r.digest, r.root, r.blocks, l.root, l.blocks, strings.Join(l.userList(), ", "), errdefs.ErrFailedPrecondition))
		} else if addr := fmt.Sprintf("%d:%d", r.disk.GetTarget(), r.disk.GetLun()); addr != l.disk {
			// Its root makes it the same content, wherever the host
			// attached it again.
			log.G(ctx).WithField("container", id).WithField("layer", r.digest).
				Debugf("layer disk named at scsi %s, already open from scsi %s with the same root: using the open one", addr, l.disk)
		}
		l.users[id] = true
		held = append(held, l)
		if err := s.checkLayer(ctx, l); err != nil {
			return fail(err)
		}
		if err := s.openLayer(ctx, l, r.disk); err != nil {
			return fail(err)
		}
	}
	return held, nil
}

// openLayer maps and mounts l, as far as it is not yet.
func (s *Service) openLayer(ctx context.Context, l *layer, disk *agentapi.ScsiDisk) error {
	dev := s.layerDevices()
	if !l.dmOpen {
		node, err := dev.Find(ctx, disk)
		if err != nil {
			return fmt.Errorf("layer %s: %w: %w", l.digest, err, errdefs.ErrNotFound)
		}
		markStep(ctx, "layer_disk")
		if s.cfg.LoadVerity != nil {
			s.layers.loadOnce.Do(s.cfg.LoadVerity)
		}
		mapped, err := dev.Open(l.dm, verityapi.Layer(node, l.root, l.blocks))
		if err != nil {
			return fmt.Errorf("layer %s (scsi %s): open its disk through dm-verity with root %s: %w", l.digest, l.disk, l.root, err)
		}
		l.device, l.dmOpen = mapped, true
		markStep(ctx, "layer_verity")
	}
	if l.mounted {
		return nil
	}
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return err
	}
	err := unix.Mount(l.device, l.dir, "ext4", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, "")
	if err == nil {
		l.mounted = true
		markStep(ctx, "layer_mount")
		log.G(ctx).WithField("layer", l.digest).WithField("disk", l.disk).WithField("root_hash", l.root).Debug("layer opened through dm-verity")
		return nil
	}
	if cerr := s.checkLayer(ctx, l); cerr != nil {
		return fmt.Errorf("%w (mount: %v)", cerr, err)
	}
	return fmt.Errorf("layer %s (scsi %s, root %s): mount its ext4 file system: %w", l.digest, l.disk, l.root, err)
}

// checkLayer returns the layer's corruption, once dm-verity has reported
// it, and logs it the first time; or the failure to read its status.
func (s *Service) checkLayer(ctx context.Context, l *layer) error {
	if l.corrupt != nil {
		// A copy: the one returned before may still be formatted by
		// the request it failed.
		e := *l.corrupt
		e.Containers = l.userList()
		return &e
	}
	if !l.dmOpen {
		return nil
	}
	bad, err := s.layerDevices().Corrupted(l.dm)
	if err != nil {
		// Fail closed: a status that cannot be read is no proof.
		return fmt.Errorf("layer %s (scsi %s): read its dm-verity status: %w", l.digest, l.disk, err)
	}
	if !bad {
		return nil
	}
	l.corrupt = &LayerCorruptedError{Digest: l.digest, RootHash: l.root, Disk: l.disk, Containers: l.userList()}
	log.G(ctx).WithField("layer", l.digest).WithField("disk", l.disk).WithField("containers", l.userList()).Error(l.corrupt.Error())
	return l.corrupt
}

// layersCorrupted returns the corruption of any of ls (nil: none seen).
func (s *Service) layersCorrupted(ctx context.Context, ls []*layer) error {
	if len(ls) == 0 {
		return nil
	}
	s.layers.mu.Lock()
	defer s.layers.mu.Unlock()
	var errs []error
	for _, l := range ls {
		if err := s.checkLayer(ctx, l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (l *layer) userList() []string {
	us := make([]string, 0, len(l.users))
	for u := range l.users {
		us = append(us, u)
	}
	slices.Sort(us)
	return us
}

// releaseLayers gives back the layers container id held; a layer no
// container uses any more is unmounted and its mapping removed.
func (s *Service) releaseLayers(ctx context.Context, id string, ls []*layer) {
	if len(ls) == 0 {
		return
	}
	s.layers.mu.Lock()
	defer s.layers.mu.Unlock()
	s.releaseLocked(ctx, id, ls)
}

func (s *Service) releaseLocked(ctx context.Context, id string, ls []*layer) {
	seen := map[*layer]bool{}
	for _, l := range ls {
		if seen[l] {
			continue
		}
		seen[l] = true
		delete(l.users, id)
		if len(l.users) > 0 {
			continue
		}
		if l.mounted {
			if err := unmountLayer(l.dir); err != nil {
				log.G(ctx).WithError(err).WithField("layer", l.digest).Warn("unmount the layer")
			} else {
				l.mounted = false
				_ = os.Remove(l.dir)
			}
		}
		if l.dmOpen && !l.mounted {
			if err := closeMapping(s.layerDevices(), l.dm); err != nil {
				log.G(ctx).WithError(err).WithField("layer", l.digest).Warn("remove the layer's dm-verity mapping")
			} else {
				l.dmOpen = false
			}
		}
		if !l.mounted && !l.dmOpen {
			delete(s.layers.layers, l.hex)
			log.G(ctx).WithField("layer", l.digest).Debug("layer closed: no container uses it")
		}
		// Else it stays, unused, and is taken again as it is.
	}
}

// busyRetries and busyWait bound how long a layer's release waits for
// the last user of its mount to go: the overlay of a container just
// deleted can stay busy while its killed processes are reaped.
const (
	busyRetries = 40
	busyWait    = 25 * time.Millisecond
)

// unmountLayer unmounts a layer, waiting a while for it to be unused, and
// lazily at last.
func unmountLayer(dir string) error {
	for range busyRetries {
		err := unix.Unmount(dir, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
		time.Sleep(busyWait)
	}
	return rootfs.Unmount(dir)
}

// closeMapping removes a layer's mapping, waiting a while for a lazily
// unmounted file system on it to let go.
func closeMapping(d LayerDevices, name string) error {
	var err error
	for range busyRetries {
		if err = d.Close(name); err == nil || !errors.Is(err, unix.EBUSY) {
			return err
		}
		time.Sleep(busyWait)
	}
	return err
}

// layerDirs are the overlay's lower directories of ls: the top layer
// first, each once (a layer the image has twice adds nothing the upper
// copy does not).
func layerDirs(ls []*layer) []string {
	var dirs []string
	for i := len(ls) - 1; i >= 0; i-- {
		if !slices.Contains(dirs, ls[i].dir) {
			dirs = append(dirs, ls[i].dir)
		}
	}
	return dirs
}

// layeredRoot mounts container c's root from the layers of r: each opened
// through dm-verity with the root its rule pins (or the host's where
// nothing pins it), stacked under a writable layer in guest memory.
func (s *Service) layeredRoot(ctx context.Context, c *container, r *agentapi.Rootfs, spec *specs.Spec) error {
	_, reqs, err := rootOf(c.id, r)
	if err != nil {
		return err
	}
	reqs = pinLayers(ctx, c.id, reqs, c.policy().PinnedLayers())
	ls, err := s.acquireLayers(ctx, c.id, reqs)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.layers = ls // released with the container (cleanup), whatever follows
	c.mu.Unlock()
	dirs := layerDirs(ls)
	var hide []string
	if artefactLostFound(dirs) {
		hide = []string{"lost+found"}
	}
	return s.stackRoot(ctx, c, dirs, spec, hide)
}

// artefactLostFound reports whether /lost+found in the stacked layers is
// only the converter's: every layer disk is an ext4 file system, which
// has an empty lost+found directory (root's, mode 0700) whether or not the
// layer's tar had one (measurements/layer). A container run from the
// image's tars by any other runtime has no such directory, so it is
// hidden unless some layer's holds an entry or differs in owner or mode,
// which only the image can have made it. (An image that ships an empty,
// root-owned 0700 /lost+found loses it; its contents would be nothing.)
func artefactLostFound(layerDirs []string) bool {
	found := false
	for _, d := range layerDirs {
		p := filepath.Join(d, "lost+found")
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return false
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Mode&0o7777 != 0o700 || st.Uid != 0 || st.Gid != 0 {
			return false
		}
		entries, err := os.ReadDir(p)
		if err != nil || len(entries) > 0 {
			return false
		}
		found = true
	}
	return found
}
