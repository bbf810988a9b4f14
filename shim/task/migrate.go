package task

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/migrate"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
	"github.com/c8s-dev/c8s/shim/layers"
	"github.com/c8s-dev/c8s/shim/sandbox"
)

// Migrate live-migrates the pod VM to another node (shim/sandbox Migrate):
// containerd keeps managing its tasks through this shim.
func (a admin) Migrate(ctx context.Context, r *adminapi.MigrateRequest) (*adminapi.MigrateResponse, error) {
	return a.s.migrate(ctx, r)
}

// MigrationProgress reports the running migration.
func (a admin) MigrationProgress(_ context.Context, _ *adminapi.MigrationProgressRequest) (*adminapi.MigrationProgressResponse, error) {
	sb, _, err := a.s.runningPod()
	if err != nil {
		return nil, err
	}
	info, active := sb.MigrationProgress()
	resp := &adminapi.MigrationProgressResponse{Active: active, Status: info.Status}
	if info.RAM != nil {
		resp.Transferred, resp.Remaining, resp.Total = info.RAM.Transferred, info.RAM.Remaining, info.RAM.Total
		resp.DirtyPagesRate, resp.Mbps = info.RAM.DirtyPagesRate, info.RAM.Mbps
	}
	return resp, nil
}

func (s *service) runningPod() (Sandbox, *podState, error) {
	s.mu.Lock()
	sb, pod := s.sb, s.pod
	s.mu.Unlock()
	if sb == nil || pod == nil || vmGone(sb) {
		return nil, nil, fmt.Errorf("no running pod VM in this shim: %w", errdefs.ErrFailedPrecondition)
	}
	return sb, pod, nil
}

func (s *service) migrate(ctx context.Context, r *adminapi.MigrateRequest) (*adminapi.MigrateResponse, error) {
	if r.Destination == "" {
		return nil, fmt.Errorf("no destination: give the destination node's `c8s-launcher serve` socket or tls://HOST:PORT: %w", errdefs.ErrInvalidArgument)
	}
	sb, pod, err := s.runningPod()
	if err != nil {
		return nil, err
	}
	dst, err := migrate.Dial(r.Destination, pod.cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	held, err := migratingLayers(pod)
	if err != nil {
		return nil, fmt.Errorf("the pod's image layers: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	m, err := sb.Migrate(ctx, pod.cfg, dst, sandbox.MigrateOptions{
		Timeout:      time.Duration(r.TimeoutSeconds) * time.Second,
		MaxBandwidth: r.MaxBandwidth,
		Layers:       held.layers,
		Namespace:    held.namespace,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	held.handOff(ctx)
	claims, err := json.Marshal(m.Verified.Claims()) // null when attestation is off
	if err != nil {
		return nil, err
	}
	res := m.Result
	return &adminapi.MigrateResponse{
		Sandbox: pod.id, Node: m.Node, ClaimsJson: claims,
		QemuTotalMs: res.Info.TotalTime, DowntimeMs: res.Info.Downtime,
		TotalMs: res.Total.Milliseconds(), ReattestMs: res.Reattest.Milliseconds(),
	}, nil
}

// heldLayers are the image layers a moving pod VM has attached.
type heldLayers struct {
	cache     *layercache.Cache
	ref       string
	namespace string
	layers    []migrate.Layer
}

// migratingLayers describes the layer disks attached to the pod VM, from
// the node's layer cache, for the destination, which attaches its own
// copy of each at the same address (launcher/migrate).
func migratingLayers(pod *podState) (*heldLayers, error) {
	pl := pod.heldLayers()
	if pl == nil {
		return &heldLayers{}, nil
	}
	ids := pl.Attached()
	if len(ids) == 0 {
		return &heldLayers{}, nil
	}
	cache, err := layercache.Open(pod.cfg.LayerCachePath())
	if err != nil {
		return nil, err
	}
	h := &heldLayers{cache: cache, ref: pl.RefName()}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, d := range ids {
		e, err := cache.Lookup(d)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", d, err)
		}
		if h.namespace == "" {
			if ref, err := cache.Ref(d, h.ref); err == nil {
				h.namespace = ref.Namespace
			}
		}
		h.layers = append(h.layers, migrate.Layer{
			Disk: layers.DiskID(d), DiffID: d, RootHash: e.RootHash, DataBlocks: e.DataBlocks,
			Blob: e.Source, MediaType: e.MediaType,
		})
	}
	return h, nil
}

// handOff drops the pod's references on its layers in this node's cache
// once the VM runs on the destination, which holds its own: nothing here
// uses them any more, and pruning may take them. The pod's layers.Pod
// still lists them, and releasing them later finds no reference.
func (h *heldLayers) handOff(ctx context.Context) {
	for _, l := range h.layers {
		if err := h.cache.Release(ctx, l.DiffID, h.ref); err != nil {
			log.G(ctx).WithError(err).WithField("layer", l.DiffID).Warn("dropping the moved pod's reference on a cached layer")
		}
	}
	if len(h.layers) > 0 {
		log.G(ctx).WithFields(log.Fields{"layers": len(h.layers), "cache": h.cache.Dir()}).Info("the moved pod's layer references handed off to the destination")
	}
}
