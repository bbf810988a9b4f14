package task

import (
	"encoding/json"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm"
)

func i64(v int64) *int64   { return &v }
func u64(v uint64) *uint64 { return &v }
func quota(q int64, p uint64) *specs.LinuxResources {
	return &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: &q, Period: &p}}
}
func memLimit(mib int64) *specs.LinuxResources {
	l := mib << 20
	return &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &l}}
}

// shapeOf is the shape of a VM started from h, grown by nothing yet.
func shapeOf(h config.Hypervisor) vmShape {
	return vmShape{
		Size:      vm.Size{VCPUs: h.DefaultVCPUs, MaxVCPUs: h.VCPUCapacity(), MemoryMiB: h.DefaultMemoryMiB, MaxMemoryMiB: h.MemoryCapacityMiB()},
		bootVCPUs: h.DefaultVCPUs, base: h.DefaultMemoryMiB, refusal: h.HotplugRefusal(),
	}
}

func hyp(tee string, vcpus, maxVCPUs, mem, maxMem uint32) config.Hypervisor {
	h := config.Default().Hypervisor
	h.TEE, h.DefaultVCPUs, h.DefaultMaxVCPUs, h.DefaultMemoryMiB, h.DefaultMaxMemoryMiB = tee, vcpus, maxVCPUs, mem, maxMem
	return h
}

func TestPlanGrowth(t *testing.T) {
	fixed := shapeOf(hyp("sim", 1, 0, 512, 0))
	room := shapeOf(hyp("sim", 1, 4, 512, 2048))
	snp := shapeOf(hyp("snp", 2, 0, 1024, 0))
	tdx := shapeOf(hyp("tdx", 2, 0, 1024, 0))
	grown := room
	grown.VCPUs, grown.MemoryMiB = 2, 1152

	for _, c := range []struct {
		name  string
		res   *specs.LinuxResources
		shape vmShape
		want  growth
		err   []string // the refusal names each
	}{
		// Fits: applied to the cgroup only, whatever the TEE.
		{"lower", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(50000), Period: u64(100000), Shares: u64(512)}, Memory: memLimit(128).Memory, Pids: &specs.LinuxPids{Limit: 10}}, fixed, growth{}, nil},
		{"one-cpu", quota(100000, 100000), fixed, growth{}, nil},
		{"unlimited", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(-1)}, Memory: &specs.LinuxMemory{Limit: i64(-1)}}, fixed, growth{}, nil},
		{"memory-up-to-vm", memLimit(512), fixed, growth{}, nil},
		{"snp-fits", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(200000)}, Memory: memLimit(1000).Memory}, snp, growth{}, nil},
		{"no-period", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(150000)}}, room, growth{vcpus: 2}, nil},
		{"cpuset-fits", &specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: "0"}}, fixed, growth{}, nil},
		{"grown-fits", memLimit(1000), grown, growth{}, nil},

		// Grows within the room.
		{"cpu-grows", quota(250000, 100000), room, growth{vcpus: 3}, nil},
		{"cpuset-grows", &specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: "0,3"}}, room, growth{vcpus: 4}, nil},
		// The guest's 512 MiB plus the limit, in 128 MiB steps.
		{"memory-grows", memLimit(600), room, growth{memMiB: 1152}, nil},
		{"memory-grows-exact", memLimit(1024), room, growth{memMiB: 1536}, nil},
		{"both-grow", &specs.LinuxResources{CPU: quota(200000, 100000).CPU, Memory: memLimit(700).Memory}, room, growth{vcpus: 2, memMiB: 1280}, nil},

		// Refused, saying what was asked, what the VM has and what to set.
		{"cpu-no-hotplug", quota(200000, 100000), fixed,
			growth{}, []string{"a CPU limit of 2 CPUs (quota 200000 µs per period 100000 µs) needs 2 vCPUs", "has 1", "CPU hot-plug is off", "hypervisor.default_maxvcpus to at least 2", "hypervisor.default_vcpus"}},
		{"cpu-beyond-room", quota(450000, 100000), room,
			growth{}, []string{"4.5 CPUs", "needs 5 vCPUs", "has 1 and can grow to 4 (hypervisor.default_maxvcpus)", "at least 5"}},
		{"cpuset-beyond-room", &specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: "0-7"}}, room,
			growth{}, []string{`cpuset "0-7" (CPU 7) needs 8 vCPUs`}},
		{"memory-no-hotplug", memLimit(768), fixed,
			growth{}, []string{"a memory limit of 768 MiB does not fit in the pod VM's 512 MiB", "memory hot-plug is off", "hypervisor.default_maxmemory to at least 1280", "hypervisor.default_memory"}},
		// Room used up by an earlier growth.
		{"memory-room-used", memLimit(2100), func() vmShape { s := room; s.MemoryMiB = 2048; return s }(),
			growth{}, []string{"a memory limit of 2100 MiB does not fit in the pod VM's 2048 MiB", "needs 2688 MiB", "more than hypervisor.default_maxmemory 2048 MiB"}},
		{"cpu-room-used", quota(500000, 100000), func() vmShape { s := room; s.VCPUs = 4; return s }(),
			growth{}, []string{"needs 5 vCPUs, the pod VM has 4 and can grow to 4 (hypervisor.default_maxvcpus)"}},
		{"memory-beyond-room", memLimit(1600), room,
			growth{}, []string{"a memory limit of 1600 MiB", "needs 2176 MiB", "more than hypervisor.default_maxmemory 2048 MiB", "at least 2176"}},
		{"snp-cpu", quota(300000, 100000), snp,
			growth{}, []string{"needs 3 vCPUs, the pod VM has 2 and cannot grow", "tee snp cannot grow", "VMSA", "hypervisor.default_vcpus"}},
		{"snp-memory", memLimit(2048), snp,
			growth{}, []string{"2048 MiB does not fit in the pod VM's 1024 MiB, and the VM cannot grow", "PVALIDATE", "hypervisor.default_memory"}},
		{"tdx-memory", memLimit(1500), tdx,
			growth{}, []string{"tee tdx cannot grow", "TDG.MEM.PAGE.ACCEPT"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := planGrowth(c.res, c.shape)
			if c.err == nil {
				if err != nil || g != c.want {
					t.Fatalf("planGrowth = %+v, %v; want %+v", g, err, c.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("planGrowth = %+v, want a refusal", g)
			}
			for _, w := range c.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestUnchangeable: what CRI sends (the spec's whole resources, device
// rules and all, with new limits) passes; a change to anything but the
// limits is refused by name.
func TestUnchangeable(t *testing.T) {
	created := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}, {Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"}},
		CPU:     &specs.LinuxCPU{Shares: u64(2), Quota: i64(10000), Period: u64(100000)},
		Memory:  &specs.LinuxMemory{Limit: i64(64 << 20)},
		Unified: map[string]string{"memory.high": "max"},
		// The kubelet gives every container zero limits for each huge
		// page size.
		HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB"}, {Pagesize: "1GB"}},
	}
	var update specs.LinuxResources
	b, _ := json.Marshal(created)
	if err := json.Unmarshal(b, &update); err != nil {
		t.Fatal(err)
	}
	update.CPU.Quota, update.Memory.Limit, update.Memory.Swap = i64(20000), i64(128<<20), i64(128<<20)
	update.Pids = &specs.LinuxPids{Limit: 100}
	// CRI appends the request's huge page limits to the spec's.
	update.HugepageLimits = append(update.HugepageLimits, created.HugepageLimits...)
	if err := unchangeable(created, &update); err != nil {
		t.Fatalf("CRI-style update refused: %v", err)
	}
	if err := unchangeable(nil, memLimit(1)); err != nil {
		t.Fatalf("update of a container created without resources: %v", err)
	}
	got := cgroupResources(&update)
	if got.Devices != nil || got.Unified != nil || *got.CPU.Quota != 20000 || *got.Memory.Swap != 128<<20 || got.Pids.Limit != 100 {
		t.Errorf("applied resources: %+v", got)
	}

	for _, c := range []struct {
		name   string
		change func(r *specs.LinuxResources)
		want   string
	}{
		{"devices", func(r *specs.LinuxResources) {
			r.Devices = append(r.Devices, specs.LinuxDeviceCgroup{Allow: true, Access: "rwm"})
		}, "it changes devices,"},
		{"unified", func(r *specs.LinuxResources) { r.Unified["cgroup.subtree_control"] = "+cpuset" }, "it changes unified,"},
		{"hugepages", func(r *specs.LinuxResources) {
			r.HugepageLimits = append(r.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: "2MB", Limit: 1 << 21})
		}, "it changes hugepageLimits,"},
		{"realtime", func(r *specs.LinuxResources) { r.CPU.RealtimeRuntime = i64(1000) }, "it changes cpu.realtimeRuntime,"},
		{"oom", func(r *specs.LinuxResources) { yes := true; r.Memory.DisableOOMKiller = &yes }, "memory.disableOOMKiller"},
		{"two", func(r *specs.LinuxResources) { r.Devices = nil; r.BlockIO = &specs.LinuxBlockIO{Weight: new(uint16)} }, "it changes blockIO, devices,"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r specs.LinuxResources
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			c.change(&r)
			err := unchangeable(created, &r)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "an update changes only cpu") {
				t.Fatalf("unchangeable = %v, want it to name %q", err, c.want)
			}
		})
	}
}

func TestFormats(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{cpus(150000, 100000), "1.5"}, {cpus(200000, 100000), "2"}, {cpus(33333, 100000), "0.333"},
		{mib(768 << 20), "768 MiB"}, {mib(100<<20 + 1<<19), "100.5 MiB"},
		{growth{vcpus: 2, memMiB: 1152}.String(), "2 vCPUs and 1152 MiB"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	for list, want := range map[string]int{"": -1, "0": 0, "0-3": 3, "1,5-6": 6, "x": -1, "2-": -1} {
		if got := highestCPU(list); got != want {
			t.Errorf("highestCPU(%q) = %d, want %d", list, got, want)
		}
	}
}
