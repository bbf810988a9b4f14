package task

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/shim/layers"
	"github.com/c8s-dev/c8s/shim/rootfs"
)

// A container's root reaches its pod VM one of two ways (runtime.rootfs):
//
//   - layers (the default): the image's layers, each a read-only disk of
//     the node's layer cache attached once per pod (shim/layers), which
//     the guest opens through dm-verity and stacks with overlayfs under a
//     writable layer in guest memory. The host builds nothing per
//     container, so the start does not grow with the image, and snp and
//     tdx pods need no runtime.allow_host_rootfs: where the measured
//     policy pins the layers the guest opens them with its roots.
//   - copy: containerd's snapshot, mounted on the host and copied into
//     an ext4 disk per container (shim/rootfs), which the guest cannot
//     verify: snp and tdx need runtime.allow_host_rootfs.
//
// Layer mode takes the image containerd's container record names, for the
// node's platform, and first checks that the container's snapshot is that
// image's (its parent is the image's chain ID): a root prepared from
// something else (`ctr run --rootfs`, a snapshot committed from another
// container) is not the image. What containerd writes into a container's
// snapshot before it starts (mount points of the spec's mounts) the guest
// creates in its own writable layer; the files CRI bind-mounts (hosts,
// resolv.conf, hostname) are passed by value (sharedFiles) and the
// directories over virtio-fs, the same in both modes. A container with no
// image in containerd, or whose layers are neither cached nor in the
// content store (CRI's discard_unpacked_layers), gets the copy where
// HostRootfsAllowed allows it, and otherwise fails saying both.

// containerRoot is how one container's root reaches the pod VM.
type containerRoot struct {
	// layered: the image's layers (pod.layers holds them); disks are
	// their disks, bottom first.
	layered bool
	disks   []vm.Disk
	// disk is the copy's disk otherwise.
	disk vm.Disk
	// pulled: no disk at all, the guest pulls the image its policy
	// names (guestpull.go).
	pulled bool
}

// bootDisks are the disks to attach when the container's Create boots
// the VM.
func (r *containerRoot) bootDisks() []vm.Disk {
	if r.pulled {
		return nil
	}
	if r.layered {
		return r.disks
	}
	return []vm.Disk{r.disk}
}

// prepareRoot makes container r.ID's root ready on the host: its layers
// acquired (built where the cache lacks them), or its copy built.
func (s *service) prepareRoot(ctx context.Context, pod *podState, ns string, r *taskAPI.CreateTaskRequest) (*containerRoot, error) {
	t0 := time.Now()
	if root := s.guestPullRoot(ctx, pod, r); root != nil {
		return root, nil
	}
	if pod.cfg.Runtime.Rootfs != config.RootfsCopy {
		disks, err := s.prepareLayers(ctx, pod, ns, r.ID)
		if err == nil {
			log.G(ctx).WithFields(log.Fields{"container": r.ID, "layers": len(disks), "took": time.Since(t0).Round(time.Millisecond)}).Debug("image layers ready")
			return &containerRoot{layered: true, disks: disks}, nil
		}
		if !errors.Is(err, layers.ErrUnavailable) {
			return nil, fmt.Errorf("container %q: image layers: %w", r.ID, err)
		}
		if why := pod.cfg.HostRootfsAllowed(); why != nil {
			return nil, fmt.Errorf("container %q: %w; and %w: %w", r.ID, err, why, errdefs.ErrFailedPrecondition)
		}
		log.G(ctx).WithError(err).WithField("container", r.ID).Info("copying the container's snapshot instead")
	} else if why := pod.cfg.HostRootfsAllowed(); why != nil {
		return nil, fmt.Errorf("container %q: %w: %w", r.ID, why, errdefs.ErrFailedPrecondition)
	}
	mounts := make([]mount.Mount, 0, len(r.Rootfs))
	for _, m := range r.Rootfs {
		mounts = append(mounts, mount.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
	}
	disk := vm.Disk{ID: diskID(r.ID), Path: copyDiskPath(pod, r.ID)}
	if err := s.host.BuildRootfs(ctx, mounts, filepath.Join(r.Bundle, "rootfs"), disk.Path); err != nil {
		return nil, fmt.Errorf("prepare the root disk of container %q: %w", r.ID, err)
	}
	log.G(ctx).WithField("container", r.ID).WithField("took", time.Since(t0).Round(time.Millisecond)).Debug("root disk ready")
	return &containerRoot{disk: disk}, nil
}

// copyDiskPath is where container id's root disk goes when its snapshot
// is copied.
func copyDiskPath(pod *podState, id string) string {
	return filepath.Join(pod.diskDir, id+".img")
}

// prepareLayers acquires container id's image layers for the pod.
func (s *service) prepareLayers(ctx context.Context, pod *podState, ns, id string) ([]vm.Disk, error) {
	pl, err := s.podLayers(pod, ns)
	if err != nil {
		return nil, err
	}
	images, err := s.host.OpenImages(ctx)
	if err != nil {
		return nil, fmt.Errorf("containerd's images: %w", err)
	}
	defer images.Close()
	return pl.Prepare(namespaces.WithNamespace(ctx, ns), images, id)
}

// podLayers returns the pod's layers, opening the node's layer cache on
// first use.
func (s *service) podLayers(pod *podState, ns string) (*layers.Pod, error) {
	pod.layersMu.Lock()
	defer pod.layersMu.Unlock()
	if pod.layers != nil {
		return pod.layers, nil
	}
	cache, err := layercache.Open(pod.cfg.LayerCachePath())
	if err != nil {
		return nil, err
	}
	if h, ok := s.host.(interface {
		LayerAccountant(cacheDir string) layercache.Accountant
	}); ok {
		if a := h.LayerAccountant(cache.Dir()); a != nil {
			cache.Account(a)
		}
	}
	ref, err := layercache.PodRef(ns, pod.id, pod.stateDir)
	if err != nil {
		return nil, err
	}
	pod.layers = layers.NewPod(cache, s.convertLayer, ref)
	return pod.layers, nil
}

func (s *service) convertLayer(ctx context.Context, blob io.Reader, mediaType string, out io.ReadWriteSeeker) (layers.Info, error) {
	return s.host.ConvertLayer(ctx, blob, mediaType, out)
}

// attachRoot attaches the container's root to the running VM (a no-op for
// disks it booted with) and returns it as the agent's Rootfs.
func (s *service) attachRoot(ctx context.Context, pod *podState, sb Sandbox, id string, root *containerRoot) (*agent.Rootfs, error) {
	if root.pulled {
		return &agent.Rootfs{}, nil // no root: the guest pulls (guestpull.go)
	}
	if root.layered {
		ls, err := pod.layers.Attach(ctx, sb, id)
		if err != nil {
			return nil, fmt.Errorf("container %q: %w", id, err)
		}
		return &agent.Rootfs{Layers: ls, Fstype: layers.FSType}, nil
	}
	addr, err := sb.AttachDisk(ctx, root.disk)
	if err != nil {
		return nil, fmt.Errorf("attach the root disk of container %q: %w", id, err)
	}
	return &agent.Rootfs{
		Source: &agent.Rootfs_Scsi{Scsi: &agent.ScsiDisk{Target: uint32(addr.Target), Lun: uint32(addr.LUN)}},
		Fstype: rootfs.FSType,
	}, nil
}

// releaseRoot undoes prepareRoot and attachRoot: it detaches what only
// this container used from m (nil when the VM is gone or going) and
// drops its layers or removes its copy.
func (s *service) releaseRoot(ctx context.Context, pod *podState, m Machine, id string, root *containerRoot) {
	if root.pulled {
		return
	}
	if root.layered {
		pod.layers.Release(ctx, m, id)
		return
	}
	if m != nil {
		if err := m.DetachDisk(ctx, root.disk.ID); err != nil {
			log.G(ctx).WithError(err).Warn("detach container root disk")
		}
	}
	if err := s.host.RemoveRootfs(root.disk.Path); err != nil {
		log.G(ctx).WithError(err).Warn("remove container root disk")
	}
}
