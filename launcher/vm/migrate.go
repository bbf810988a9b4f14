package vm

import (
	"context"
	"fmt"
	"sort"
)

// Live migration over QMP: commands with QEMU's own JSON names
// (qapi/migration.json).

// Migration states of query-migrate that end a migration.
const (
	MigrationCompleted = "completed"
	MigrationFailed    = "failed"
	MigrationCancelled = "cancelled"
)

// RunStatePostmigrate is the source's run state after a completed
// migration: paused, resumable with Cont.
const RunStatePostmigrate = "postmigrate"

// MigrationRAM is query-migrate's "ram" member.
type MigrationRAM struct {
	Transferred    uint64  `json:"transferred"`
	Remaining      uint64  `json:"remaining"`
	Total          uint64  `json:"total"`
	DirtyPagesRate uint64  `json:"dirty-pages-rate"`
	DirtySyncCount uint64  `json:"dirty-sync-count"`
	PageSize       uint64  `json:"page-size"`
	Mbps           float64 `json:"mbps"`
}

// SocketAddress is one address a destination listens on.
type SocketAddress struct {
	Type string `json:"type"`
	Host string `json:"host"`
	Port string `json:"port"`
	Path string `json:"path"`
}

// MigrationInfo is query-migrate's answer. Times are milliseconds.
type MigrationInfo struct {
	Status           string          `json:"status"`
	TotalTime        int64           `json:"total-time"`
	SetupTime        int64           `json:"setup-time"`
	Downtime         int64           `json:"downtime"`
	ExpectedDowntime int64           `json:"expected-downtime"`
	RAM              *MigrationRAM   `json:"ram"`
	ErrorDesc        string          `json:"error-desc"`
	SocketAddress    []SocketAddress `json:"socket-address"`
}

// MigrationParameters are the migrate-set-parameters this package sets;
// zero leaves QEMU's value.
type MigrationParameters struct {
	// MaxBandwidth is in bytes per second (QEMU's default is 128 MiB/s).
	MaxBandwidth uint64
	// DowntimeLimit is the longest acceptable pause in milliseconds.
	DowntimeLimit uint64
}

// SetMigrationCapabilities sets migration capabilities by QEMU's names
// (for example "events", "auto-converge").
func (q *QMP) SetMigrationCapabilities(ctx context.Context, caps map[string]bool) error {
	names := make([]string, 0, len(caps))
	for n := range caps {
		names = append(names, n)
	}
	sort.Strings(names)
	var list []map[string]any
	for _, n := range names {
		list = append(list, map[string]any{"capability": n, "state": caps[n]})
	}
	return q.Execute(ctx, "migrate-set-capabilities", map[string]any{"capabilities": list}, nil)
}

// SetMigrationParameters sets the non-zero parameters of p.
func (q *QMP) SetMigrationParameters(ctx context.Context, p MigrationParameters) error {
	args := map[string]any{}
	if p.MaxBandwidth != 0 {
		args["max-bandwidth"] = p.MaxBandwidth
	}
	if p.DowntimeLimit != 0 {
		args["downtime-limit"] = p.DowntimeLimit
	}
	if len(args) == 0 {
		return nil
	}
	return q.Execute(ctx, "migrate-set-parameters", args, nil)
}

// Migrate starts migrating the VM to uri ("tcp:HOST:PORT"); it returns
// once the migration has started. Follow it with QueryMigrate.
func (q *QMP) Migrate(ctx context.Context, uri string) error {
	return q.Execute(ctx, "migrate", map[string]any{"uri": uri}, nil)
}

// MigrateIncoming makes a VM started with Spec.Incoming listen on uri;
// "tcp:HOST:0" picks a free port, which QueryMigrate's SocketAddress then
// reports.
func (q *QMP) MigrateIncoming(ctx context.Context, uri string) error {
	return q.Execute(ctx, "migrate-incoming", map[string]any{"uri": uri}, nil)
}

// QueryMigrate reports the state of the current or last migration.
func (q *QMP) QueryMigrate(ctx context.Context) (MigrationInfo, error) {
	var info MigrationInfo
	err := q.Execute(ctx, "query-migrate", nil, &info)
	return info, err
}

// MigrateCancel cancels the outgoing migration.
func (q *QMP) MigrateCancel(ctx context.Context) error {
	return q.Execute(ctx, "migrate_cancel", nil, nil)
}

// Cont resumes a paused VM, also one left in RunStatePostmigrate by a
// completed migration (QEMU then takes its disks back).
func (q *QMP) Cont(ctx context.Context) error {
	return q.Execute(ctx, "cont", nil, nil)
}

// RunState returns query-status's status ("running", "paused",
// "inmigrate", RunStatePostmigrate, ...).
func (q *QMP) RunState(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := q.Execute(ctx, "query-status", nil, &st)
	return st.Status, err
}

// MigrationSpec returns the Spec a migration destination must start QEMU
// with to receive this VM: the same machine, with the disks attached now
// (hot-plugged ones included) cold-plugged at their SCSI targets. Disks
// must occupy targets 0..n-1: Args cold-plugs in order.
func (v *VM) MigrationSpec() (Spec, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.spec.SharedFS != nil {
		return Spec{}, fmt.Errorf("vm: a VM with a virtio-fs share cannot migrate (QEMU 7.2 marks vhost-user-fs unmigratable)")
	}
	if h := v.spec.Hypervisor; h.VCPUCapacity() > h.DefaultVCPUs || h.MemoryCapacityMiB() > h.DefaultMemoryMiB {
		return Spec{}, fmt.Errorf("vm: a VM with room for vCPU or memory hot-plug (hypervisor.default_maxvcpus, default_maxmemory) cannot migrate yet: the destination would need the same room and what was hot-plugged")
	}
	if len(v.spec.NICs) > 0 {
		return Spec{}, fmt.Errorf("vm: a VM wired to a pod network cannot migrate yet: the destination needs its own taps in the pod's network namespace")
	}
	s := v.spec
	s.Disks = nil
	byID := map[string]Disk{}
	for _, d := range v.spec.Disks {
		byID[d.ID] = d
	}
	for _, d := range v.hotDisks {
		byID[d.ID] = d
	}
	for t := 0; t < len(v.targets); t++ {
		id, ok := v.targets[t]
		if !ok {
			return Spec{}, fmt.Errorf("vm: SCSI target %d is free while %d disks are attached: a VM whose disks left a gap cannot migrate yet", t, len(v.targets))
		}
		d, ok := byID[id]
		if !ok {
			return Spec{}, fmt.Errorf("vm: disk %q at target %d is unknown", id, t)
		}
		s.Disks = append(s.Disks, d)
	}
	s.Incoming = false
	return s, nil
}
