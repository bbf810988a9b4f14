package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

func TestParseUpdateTakesOnlyCgroupLimits(t *testing.T) {
	res, err := parseUpdate([]byte(`{"cpu":{"shares":512,"quota":50000,"period":100000,"cpus":"0-1","mems":"0"},
		"memory":{"limit":33554432,"reservation":16777216,"swap":33554432},"pids":{"limit":64}}`))
	if err != nil {
		t.Fatal(err)
	}
	if *res.CPU.Shares != 512 || *res.CPU.Quota != 50000 || *res.CPU.Period != 100000 || res.CPU.Cpus != "0-1" || res.CPU.Mems != "0" ||
		*res.Memory.Limit != 32<<20 || *res.Memory.Reservation != 16<<20 || *res.Memory.Swap != 32<<20 || res.Pids.Limit != 64 {
		t.Errorf("parsed %+v %+v %+v", res.CPU, res.Memory, res.Pids)
	}
	if res, err := parseUpdate([]byte(`{}`)); err != nil || res.CPU != nil || res.Memory != nil || res.Pids != nil {
		t.Errorf("empty update: %+v, %v", res, err)
	}

	for _, c := range []struct{ name, doc, want string }{
		// What an update must never reach: what the container may access.
		{"devices", `{"memory":{"limit":1048576},"devices":[{"allow":true,"access":"rwm"}]}`, `unknown field "devices"`},
		{"unified", `{"unified":{"cgroup.subtree_control":"+cpuset"}}`, `unknown field "unified"`},
		{"hugepages", `{"hugepageLimits":[{"pageSize":"2MB","limit":1}]}`, `unknown field "hugepageLimits"`},
		{"rdma", `{"rdma":{"mlx":{"hcaHandles":1}}}`, `unknown field "rdma"`},
		{"blockio", `{"blockIO":{"weight":10}}`, `unknown field "blockIO"`},
		{"network", `{"network":{"classID":1}}`, `unknown field "network"`},
		{"realtime", `{"cpu":{"realtimeRuntime":1000}}`, `unknown field "realtimeRuntime"`},
		{"kernel-memory", `{"memory":{"kernel":1048576}}`, `unknown field "kernel"`},
		{"oom-killer", `{"memory":{"disableOOMKiller":true}}`, `unknown field "disableOOMKiller"`},
		// A whole spec (namespaces, mounts, process) is not resources.
		{"spec", `{"ociVersion":"1.0.2","linux":{"namespaces":[{"type":"network","path":"/proc/1/ns/net"}]}}`, `unknown field "ociVersion"`},
		{"trailing", `{"pids":{"limit":5}} {"devices":[]}`, "data after its object"},
		{"not-json", `{`, "unexpected EOF"},
		{"shares", `{"cpu":{"shares":1}}`, "cpu.shares 1 is out of range"},
		{"quota", `{"cpu":{"quota":5}}`, "cpu.quota 5"},
		{"period", `{"cpu":{"period":5000000}}`, "cpu.period 5000000 is out of range"},
		{"cpus", `{"cpu":{"cpus":"0-1;rm -rf /"}}`, `cpu.cpus "0-1;rm -rf /"`},
		{"mems", `{"cpu":{"mems":"3-1"}}`, `cpu.mems "3-1"`},
		{"memory", `{"memory":{"limit":-5}}`, "memory.limit -5"},
		{"pids", `{"pids":{"limit":-2}}`, "pids.limit -2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseUpdate([]byte(c.doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("parseUpdate(%s) = %v, want an error containing %q", c.doc, err, c.want)
			}
		})
	}
	if _, err := parseUpdate([]byte(`{"pids":{"limit":1},"x":"` + strings.Repeat("a", maxResourcesSize) + `"}`)); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("oversized document: %v", err)
	}
}

// cgroupFile reads a cgroup file of the container: the v1 controller's
// (controller/file1) or the unified hierarchy's (file2).
func cgroupFile(t *testing.T, cgroup, controller, file1, file2 string) string {
	t.Helper()
	for _, p := range []string{filepath.Join(cgroupRoot, controller, cgroup, file1), filepath.Join(cgroupRoot, cgroup, file2)} {
		if data, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(data))
		}
	}
	t.Fatalf("cgroup %s has neither %s/%s nor %s", cgroup, controller, file1, file2)
	return ""
}

// TestUpdateContainerChangesItsCgroup runs the update through the real OCI
// runtime on the host's cgroups (v1 where the tests run, v2 in the guest):
// limits go down and up, a refused update changes nothing.
func TestUpdateContainerChangesItsCgroup(t *testing.T) {
	e := newEnv(t)
	s := e.spec(t, "sleep", "600")
	limit, quota, period := int64(64<<20), int64(50000), uint64(100000)
	s.Linux.Resources = &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &limit},
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
		Pids:   &specs.LinuxPids{Limit: 100},
	}
	e.create(t, "upd", s, pipes(), nil)
	e.start(t, "upd")
	c, err := e.svc.lookup("upd")
	if err != nil {
		t.Fatal(err)
	}
	type want struct{ mem, quota, pids, shares string }
	check := func(t *testing.T, w want) {
		t.Helper()
		if got := cgroupFile(t, c.cgroup, "memory", "memory.limit_in_bytes", "memory.max"); got != w.mem {
			t.Errorf("memory limit %s, want %s", got, w.mem)
		}
		if q := cgroupFile(t, c.cgroup, "cpu", "cpu.cfs_quota_us", "cpu.max"); q != w.quota && !strings.HasPrefix(q, w.quota+" ") {
			t.Errorf("cpu quota %s, want %s", q, w.quota)
		}
		if got := cgroupFile(t, c.cgroup, "pids", "pids.max", "pids.max"); got != w.pids {
			t.Errorf("pids limit %s, want %s", got, w.pids)
		}
		if w.shares != "" {
			if got := cgroupFile(t, c.cgroup, "cpu", "cpu.shares", "cpu.weight"); got != w.shares {
				t.Errorf("cpu shares %s, want %s", got, w.shares)
			}
		}
	}
	check(t, want{mem: "67108864", quota: "50000", pids: "100"})
	update := func(doc string) error {
		_, err := e.agent.UpdateContainer(ctxT(t), &agentapi.UpdateContainerRequest{ContainerId: "upd", Resources: []byte(doc)})
		return err
	}

	// Down: what CRI sends for a lower limit (the whole resources of the
	// spec, filtered by the shim to what an update may change).
	if err := update(`{"memory":{"limit":33554432},"cpu":{"shares":512,"quota":20000,"period":100000},"pids":{"limit":50}}`); err != nil {
		t.Fatalf("lower the limits: %v", err)
	}
	check(t, want{mem: "33554432", quota: "20000", pids: "50", shares: "512"})
	// Up, and back to no CPU limit.
	if err := update(`{"memory":{"limit":134217728},"cpu":{"quota":-1}}`); err != nil {
		t.Fatalf("raise the limits: %v", err)
	}
	check(t, want{mem: "134217728", quota: "-1", pids: "50", shares: "512"})

	// A request that also carries devices is refused as a whole.
	err = update(`{"memory":{"limit":16777216},"devices":[{"allow":true,"access":"rwm"}]}`)
	assertCode(t, err, codes.InvalidArgument)
	if err == nil || !strings.Contains(err.Error(), "devices") {
		t.Errorf("refusal %v does not name devices", err)
	}
	check(t, want{mem: "134217728", quota: "-1", pids: "50", shares: "512"})

	// So is a cpuset naming a CPU the guest does not have.
	err = update(`{"cpu":{"cpus":"4000"}}`)
	assertCode(t, err, codes.InvalidArgument)
	if err == nil || !strings.Contains(err.Error(), "4000") {
		t.Errorf("cpuset refusal %v does not name the CPU", err)
	}
	_, err = e.agent.UpdateContainer(ctxT(t), &agentapi.UpdateContainerRequest{ContainerId: "nope", Resources: []byte(`{}`)})
	assertCode(t, err, codes.NotFound)

	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "upd", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	e.wait(t, "upd", "")
	assertCode(t, update(`{"pids":{"limit":20}}`), codes.FailedPrecondition)
	e.remove(t, "upd")
	e.assertGone(t, "upd")
}

// fakeSys lays out the sysfs files OnlineCPUMem reads: cpus CPUs (cpu0
// without a switch, the others with the given online states) and memory
// blocks of 128 MiB in the given states.
func fakeSys(t *testing.T, cpus []string, blocks []string) string {
	t.Helper()
	sys := t.TempDir()
	write := func(p, v string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, st := range cpus {
		dir := filepath.Join(sys, "devices/system/cpu", "cpu"+strconv.Itoa(i))
		if i == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		write(filepath.Join(dir, "online"), st)
	}
	write(filepath.Join(sys, "devices/system/cpu/online"), "0")
	write(filepath.Join(sys, "devices/system/cpu/possible"), "0-"+strconv.Itoa(len(cpus)))
	write(filepath.Join(sys, "devices/system/memory/block_size_bytes"), "8000000")
	for i, st := range blocks {
		write(filepath.Join(sys, "devices/system/memory", "memory"+strconv.Itoa(i*8), "state"), st)
	}
	return sys
}

func TestOnlineCPUMemOnlinesWhatWasPlugged(t *testing.T) {
	sys := fakeSys(t, []string{"", "1", "0"}, []string{"online", "online", "online", "online", "offline", "going-offline"})
	svc := &Service{cfg: Config{SysDir: sys}}
	resp, err := svc.OnlineCPUMem(context.Background(), &agentapi.OnlineCPUMemRequest{Vcpus: 3, MemoryMib: 640, TimeoutMs: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Vcpus != 3 || resp.MemoryMib != 640 || resp.PossibleVcpus != 4 {
		t.Errorf("online: %d vCPUs (of %d possible), %d MiB; want 3 (of 4) and 640", resp.Vcpus, resp.PossibleVcpus, resp.MemoryMib)
	}
	if data, _ := os.ReadFile(filepath.Join(sys, "devices/system/cpu/cpu2/online")); strings.TrimSpace(string(data)) != "1" {
		t.Errorf("cpu2 not brought online: %q", data)
	}
	if data, _ := os.ReadFile(filepath.Join(sys, "devices/system/memory/memory32/state")); strings.TrimSpace(string(data)) != "online" {
		t.Errorf("memory32 not brought online: %q", data)
	}
	if data, _ := os.ReadFile(filepath.Join(sys, "devices/system/memory/memory40/state")); strings.TrimSpace(string(data)) != "going-offline" {
		t.Errorf("a block going offline was touched: %q", data)
	}

	// What never arrives is reported, with what the guest has.
	t0 := time.Now()
	resp, err = svc.OnlineCPUMem(context.Background(), &agentapi.OnlineCPUMemRequest{Vcpus: 4, MemoryMib: 640, TimeoutMs: 200})
	if err == nil || !strings.Contains(err.Error(), "3 vCPUs and 640 MiB") || resp.GetVcpus() != 3 {
		t.Fatalf("waiting for a vCPU that never comes: %v, %v", resp, err)
	}
	if d := time.Since(t0); d < 200*time.Millisecond || d > 5*time.Second {
		t.Errorf("the wait took %s, want about its 200ms timeout", d)
	}
}

// TestOnlineCPUMemWaitsForWhatTheKernelIsStillAdding: a memory block or CPU
// the kernel lists before its switch exists is being added, not an error and
// not yet there; it counts once its switch appears.
func TestOnlineCPUMemWaitsForWhatTheKernelIsStillAdding(t *testing.T) {
	sys := fakeSys(t, []string{"", "1"}, []string{"online", "online", "online", "online"})
	for _, d := range []string{"devices/system/memory/memory32", "devices/system/cpu/cpu2"} {
		if err := os.MkdirAll(filepath.Join(sys, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	svc := &Service{cfg: Config{SysDir: sys}}
	resp, err := svc.OnlineCPUMem(context.Background(), &agentapi.OnlineCPUMemRequest{Vcpus: 2, MemoryMib: 512, TimeoutMs: 1000})
	if err != nil {
		t.Fatalf("while a block and a CPU are half-added: %v", err)
	}
	if resp.Vcpus != 2 || resp.MemoryMib != 512 {
		t.Errorf("half-added counted: %d vCPUs, %d MiB; want 2 and 512", resp.Vcpus, resp.MemoryMib)
	}
	go func() {
		time.Sleep(150 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(sys, "devices/system/memory/memory32/state"), []byte("offline\n"), 0o644)
		_ = os.WriteFile(filepath.Join(sys, "devices/system/cpu/cpu2/online"), []byte("0\n"), 0o644)
	}()
	resp, err = svc.OnlineCPUMem(context.Background(), &agentapi.OnlineCPUMemRequest{Vcpus: 3, MemoryMib: 640, TimeoutMs: 5000})
	if err != nil || resp.Vcpus != 3 || resp.MemoryMib != 640 {
		t.Fatalf("once added: %v, %v; want 3 vCPUs and 640 MiB", resp, err)
	}
}
