package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/shim/sandbox"
)

// Updating a container's resources (CRI UpdateContainerResources, `ctr
// task update`): the guest applies CPU, memory and pids limits to the
// container's cgroup. A limit the pod VM cannot honour (a CPU quota worth
// more vCPUs than it has, a memory limit above its memory) grows the VM by
// hot-plug within hypervisor.default_maxvcpus and default_maxmemory, as
// Kata does: to as many vCPUs as the quota is worth, and to the guest's own
// share (hypervisor.default_memory, what the RuntimeClass overhead pays
// for) plus the limit. What cannot be done is refused, naming the resource,
// what was asked, what the VM has and the setting to change; nothing is
// silently dropped. The VM never shrinks.

// defaultCFSPeriod is the kernel's CFS period when a quota comes without one.
const defaultCFSPeriod = 100000

// updatable names what an update may change.
const updatable = "cpu (shares, quota, period, cpus, mems), memory (limit, reservation, swap) and pids (limit)"

// update implements Update.
func (s *service) update(ctx context.Context, r *taskAPI.UpdateTaskRequest) error {
	c, err := s.get(r.ID)
	if err != nil {
		return err
	}
	if r.Resources == nil || len(r.Resources.GetValue()) == 0 {
		return fmt.Errorf("update of container %q carries no resources: %w", r.ID, errdefs.ErrInvalidArgument)
	}
	var res specs.LinuxResources
	if err := json.Unmarshal(r.Resources.GetValue(), &res); err != nil {
		return fmt.Errorf("update of container %q: decode the resources (%s): %w: %w", r.ID, r.Resources.GetTypeUrl(), err, errdefs.ErrInvalidArgument)
	}
	// Everything else must be what the container was created with: CRI
	// sends the spec's whole resources, device rules included.
	var created *specs.LinuxResources
	if _, spec, err := readSpec(c.bundle); err == nil && spec.Linux != nil {
		created = spec.Linux.Resources
	}
	if err := unchangeable(created, &res); err != nil {
		return fmt.Errorf("update of container %q refused: %w: %w", r.ID, err, errdefs.ErrInvalidArgument)
	}
	if c.init.hasExited() {
		return fmt.Errorf("container %q has exited: %w", r.ID, errdefs.ErrFailedPrecondition)
	}
	sb, err := s.sandbox()
	if err != nil {
		return err
	}
	s.mu.Lock()
	h := s.pod.cfg.Hypervisor
	s.mu.Unlock()
	shape := vmShape{bootVCPUs: h.DefaultVCPUs, base: h.DefaultMemoryMiB, refusal: h.HotplugRefusal()}
	if size, err := sb.Size(); err == nil {
		shape.Size = size
	} else {
		// Moved: it has its boot size (a VM with room to grow cannot move).
		shape.Size = vm.Size{VCPUs: h.DefaultVCPUs, MaxVCPUs: h.DefaultVCPUs, MemoryMiB: h.DefaultMemoryMiB, MaxMemoryMiB: h.DefaultMemoryMiB}
		shape.refusal = err.Error()
	}
	g, err := planGrowth(&res, shape)
	if err != nil {
		return fmt.Errorf("update of container %q refused: %w: %w", r.ID, err, errdefs.ErrFailedPrecondition)
	}
	if g.vcpus > 0 || g.memMiB > 0 {
		size, err := sb.Grow(ctx, g.vcpus, g.memMiB)
		if errors.Is(err, sandbox.ErrGuestCannotGrow) {
			_, what := vcpusNeeded(res.CPU)
			return fmt.Errorf("update of container %q refused: %s needs %d vCPUs, the pod VM has %d: %w; %s: %w",
				r.ID, what, g.vcpus, shape.VCPUs, err, strings.TrimPrefix(fmt.Sprintf(sizeHint, "default_vcpus"), "or "), errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return fmt.Errorf("update of container %q: grow the pod VM to %s: %w", r.ID, g, err)
		}
		log.G(ctx).WithFields(log.Fields{"container": r.ID, "vcpus": size.VCPUs, "memory_mib": size.MemoryMiB}).Info("pod VM grown")
	}
	doc, err := json.Marshal(cgroupResources(&res))
	if err != nil {
		return err
	}
	if _, err := sb.Agent().UpdateContainer(ctx, &agent.UpdateContainerRequest{ContainerId: r.ID, Resources: doc}); err != nil {
		return fmt.Errorf("update the resources of container %q in the pod VM: %w", r.ID, fromAgent(err))
	}
	return nil
}

// cgroupResources is the part of res that an update applies.
func cgroupResources(res *specs.LinuxResources) *specs.LinuxResources {
	out := &specs.LinuxResources{}
	if c := res.CPU; c != nil {
		out.CPU = &specs.LinuxCPU{Shares: c.Shares, Quota: c.Quota, Period: c.Period, Cpus: c.Cpus, Mems: c.Mems}
	}
	if m := res.Memory; m != nil {
		out.Memory = &specs.LinuxMemory{Limit: m.Limit, Reservation: m.Reservation, Swap: m.Swap}
	}
	if res.Pids != nil {
		out.Pids = &specs.LinuxPids{Limit: res.Pids.Limit}
	}
	return out
}

// unchangeable fails when res changes anything but what an update applies,
// compared with created, the container's resources at creation (nil: none).
func unchangeable(created, res *specs.LinuxResources) error {
	if created == nil {
		created = &specs.LinuxResources{}
	}
	rest := func(r *specs.LinuxResources) map[string]any {
		// CRI appends the request's hugepage limits to the spec's, so
		// the same limits come twice: compare them by page size.
		hugepages := map[string]uint64{}
		for _, l := range r.HugepageLimits {
			hugepages[l.Pagesize] = l.Limit
		}
		m := map[string]any{
			"devices": r.Devices, "blockIO": r.BlockIO, "hugepageLimits": hugepages,
			"network": r.Network, "rdma": r.Rdma, "unified": r.Unified,
		}
		if c := r.CPU; c != nil {
			m["cpu.burst"], m["cpu.realtimeRuntime"], m["cpu.realtimePeriod"], m["cpu.idle"] = c.Burst, c.RealtimeRuntime, c.RealtimePeriod, c.Idle
		}
		if mem := r.Memory; mem != nil {
			//lint:ignore SA1019 read, never set: an update changing the obsolete kernel-memory limit is refused like any field it does not apply
			m["memory.kernel"], m["memory.kernelTCP"], m["memory.swappiness"] = mem.Kernel, mem.KernelTCP, mem.Swappiness
			m["memory.disableOOMKiller"], m["memory.useHierarchy"], m["memory.checkBeforeUpdate"] = mem.DisableOOMKiller, mem.UseHierarchy, mem.CheckBeforeUpdate
		}
		return m
	}
	before, after := rest(created), rest(res)
	var changed []string
	for _, k := range sortedKeys(after, before) {
		if canonical(before[k]) != canonical(after[k]) {
			changed = append(changed, k)
		}
	}
	if len(changed) > 0 {
		return fmt.Errorf("it changes %s, which the container keeps from its creation: an update changes only %s",
			strings.Join(changed, ", "), updatable)
	}
	return nil
}

// canonical is v as JSON, with empty values ("null", [], {}) alike.
func canonical(v any) string {
	b, _ := json.Marshal(v)
	switch s := string(b); s {
	case "null", "[]", "{}":
		return ""
	default:
		return s
	}
}

func sortedKeys(maps ...map[string]any) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range maps {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}

// vmShape is what the pod VM has and can grow to, and why it cannot grow
// at all, if so.
type vmShape struct {
	vm.Size
	bootVCPUs uint32 // hypervisor.default_vcpus
	base      uint32 // hypervisor.default_memory: the guest's own share, MiB
	refusal   string // why the VM cannot grow (snp, tdx, moved), or ""
}

// growth is the size the VM must grow to; zero members need no growth.
type growth struct{ vcpus, memMiB uint32 }

func (g growth) String() string {
	var parts []string
	if g.vcpus > 0 {
		parts = append(parts, fmt.Sprintf("%d vCPUs", g.vcpus))
	}
	if g.memMiB > 0 {
		parts = append(parts, fmt.Sprintf("%d MiB", g.memMiB))
	}
	return strings.Join(parts, " and ")
}

// sizeHint is how to start pods bigger.
const sizeHint = "or start the pod with more (hypervisor.%s, or the annotation io.katacontainers.config.hypervisor.%[1]s where hypervisor.enable_annotations allows it)"

// planGrowth decides whether res fits the VM, must grow it, or cannot be
// done.
func planGrowth(res *specs.LinuxResources, sh vmShape) (growth, error) {
	var g growth
	if need, what := vcpusNeeded(res.CPU); need > sh.VCPUs {
		hint := fmt.Sprintf(sizeHint, "default_vcpus")
		switch {
		case sh.refusal != "":
			return g, fmt.Errorf("%s needs %d vCPUs, the pod VM has %d and cannot grow: %s; %s", what, need, sh.VCPUs, sh.refusal, strings.TrimPrefix(hint, "or "))
		case sh.MaxVCPUs <= sh.bootVCPUs:
			return g, fmt.Errorf("%s needs %d vCPUs, the pod VM has %d and CPU hot-plug is off: set hypervisor.default_maxvcpus to at least %d, %s", what, need, sh.VCPUs, need, hint)
		case need > sh.MaxVCPUs:
			return g, fmt.Errorf("%s needs %d vCPUs, the pod VM has %d and can grow to %d (hypervisor.default_maxvcpus): raise it to at least %d, %s", what, need, sh.VCPUs, sh.MaxVCPUs, need, hint)
		}
		g.vcpus = need
	}
	if m := res.Memory; m != nil && m.Limit != nil && *m.Limit > int64(sh.MemoryMiB)<<20 {
		limit := uint64(*m.Limit)
		limitMiB := uint32(min((limit+(1<<20)-1)>>20, 1<<31))
		// Room for the guest's own share beside the limit, in whole
		// hot-plug steps.
		target := sh.MemoryMiB + vm.RoundUpMemory(sh.base+limitMiB-sh.MemoryMiB)
		what := fmt.Sprintf("a memory limit of %s", mib(limit))
		hint := fmt.Sprintf(sizeHint, "default_memory")
		switch {
		case sh.refusal != "":
			return g, fmt.Errorf("%s does not fit in the pod VM's %d MiB, and the VM cannot grow: %s; %s", what, sh.MemoryMiB, sh.refusal, strings.TrimPrefix(hint, "or "))
		case sh.MaxMemoryMiB <= sh.base:
			return g, fmt.Errorf("%s does not fit in the pod VM's %d MiB and memory hot-plug is off: set hypervisor.default_maxmemory to at least %d (the guest's %d MiB plus the limit), %s", what, sh.MemoryMiB, target, sh.base, hint)
		case target > sh.MaxMemoryMiB:
			return g, fmt.Errorf("%s does not fit in the pod VM's %d MiB, and growing it for the limit needs %d MiB (the guest's %d MiB, hypervisor.default_memory, plus the limit, in steps of %d MiB), more than hypervisor.default_maxmemory %d MiB: raise it to at least %d, %s",
				what, sh.MemoryMiB, target, sh.base, config.HotplugMemoryStepMiB, sh.MaxMemoryMiB, target, hint)
		}
		g.memMiB = target
	}
	return g, nil
}

// vcpusNeeded is how many vCPUs a CPU limit asks for, and how to say it:
// the quota's worth of CPUs, rounded up, and one more than the highest
// CPU of a cpuset. Zero: no limit that needs vCPUs.
func vcpusNeeded(c *specs.LinuxCPU) (uint32, string) {
	if c == nil {
		return 0, ""
	}
	var need uint32
	var what string
	if c.Quota != nil && *c.Quota > 0 {
		period := uint64(defaultCFSPeriod)
		if c.Period != nil && *c.Period > 0 {
			period = *c.Period
		}
		q := uint64(*c.Quota)
		need = uint32(min((q+period-1)/period, 1<<31))
		what = fmt.Sprintf("a CPU limit of %s CPUs (quota %d µs per period %d µs)", cpus(q, period), q, period)
	}
	if top := highestCPU(c.Cpus); top >= 0 && uint32(top)+1 > need {
		need = uint32(top) + 1
		what = fmt.Sprintf("cpuset %q (CPU %d)", c.Cpus, top)
	}
	return need, what
}

// highestCPU is the highest CPU number in a cpuset list, -1 for none or
// one that does not parse (the guest refuses that).
func highestCPU(list string) int {
	top := -1
	for _, part := range strings.Split(list, ",") {
		_, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = part
		}
		var n int
		if _, err := fmt.Sscanf(hi, "%d", &n); err != nil || n < 0 || fmt.Sprint(n) != hi {
			continue
		}
		top = max(top, n)
	}
	return top
}

// cpus formats quota/period as a CPU count ("1.5").
func cpus(quota, period uint64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", float64(quota)/float64(period)), "0"), ".")
}

// mib formats bytes as MiB ("768 MiB", "100.5 MiB").
func mib(b uint64) string {
	if b%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", b>>20)
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
