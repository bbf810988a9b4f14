package task

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/containerd/errdefs"

	"github.com/c8s-dev/c8s/launcher/migrate"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
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
	m, err := sb.Migrate(ctx, pod.cfg, dst, sandbox.MigrateOptions{
		Timeout:      time.Duration(r.TimeoutSeconds) * time.Second,
		MaxBandwidth: r.MaxBandwidth,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
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
