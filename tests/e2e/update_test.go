package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIUpdateContainerResources changes a running container's limits
// through CRI as the kubelet's in-place resize does, in one pod VM of
// 1 vCPU and 512 MiB with room to grow to 2 vCPUs and 1280 MiB
// (hypervisor.default_maxvcpus, default_maxmemory): lower limits and a
// memory limit the VM holds reach the container's cgroup; a CPU limit worth
// 2 CPUs hot-plugs a vCPU and a 700 MiB memory limit hot-plugs memory
// (the guest's 512 MiB plus the limit), both of which the guest brings
// online; limits beyond the room are refused with the setting to change,
// and leave the cgroup as it was.
func TestCRIUpdateContainerResources(t *testing.T) {
	e := setupCRI(t)
	if err := os.WriteFile(e.config, []byte(fmt.Sprintf(`[hypervisor]
kernel = %q
initrd = %q
default_vcpus = 1
default_maxvcpus = 2
default_memory = 512
default_maxmemory = 1280
[runtime]
state_dir = %q
`, filepath.Join(e.imageDir, "vmlinuz"), filepath.Join(e.imageDir, "initrd.img"), e.stateDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	pod := runCRIPod(ctx, t, e, hostNetworkPod("resize"))
	ctr := pod.start(t, &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: "app"},
		Image:    &cri.ImageSpec{Image: image},
		Command:  []string{"sleep", "600"},
		Linux: &cri.LinuxContainerConfig{Resources: &cri.LinuxContainerResources{
			CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 256 << 20,
		}},
	})

	// What the container sees: its cgroup's limits (through a cgroup
	// namespace or not) and the VM's CPUs and memory.
	type view struct{ memMax, cpuMax, online string }
	see := func(t *testing.T) (view, uint64) {
		t.Helper()
		res, err := pod.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: ctr, Timeout: 60, Cmd: []string{"sh", "-c",
			`cg=$(sed -n 's/^0:://p' /proc/self/cgroup); cat /sys/fs/cgroup$cg/memory.max /sys/fs/cgroup$cg/cpu.max /sys/devices/system/cpu/online; sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo`}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("ExecSync: %v (exit %d, stderr %q)", err, res.GetExitCode(), res.GetStderr())
		}
		lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
		if len(lines) != 4 {
			t.Fatalf("container view: %q", res.Stdout)
		}
		kb, _ := strconv.ParseUint(lines[3], 10, 64)
		return view{lines[0], lines[1], lines[2]}, kb >> 10
	}
	// The guest's console says what it made of a hot-plug.
	console := func() string {
		logs, _ := filepath.Glob(filepath.Join(e.stateDir, "*", "*", "console.log"))
		var b strings.Builder
		for _, l := range logs {
			data, _ := os.ReadFile(l)
			fmt.Fprintf(&b, "%s:\n%s\n", l, data)
		}
		return b.String()
	}
	update := func(r *cri.LinuxContainerResources) error {
		_, err := pod.rt.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{ContainerId: ctr, Linux: r})
		return err
	}
	expect := func(t *testing.T, want view) uint64 {
		t.Helper()
		got, memTotal := see(t)
		if got != want {
			t.Fatalf("the container sees memory.max %s, cpu.max %q, CPUs %s; want %s, %q, %s", got.memMax, got.cpuMax, got.online, want.memMax, want.cpuMax, want.online)
		}
		return memTotal
	}
	boot := expect(t, view{"268435456", "50000 100000", "0"})
	t.Logf("boot: guest MemTotal %d MiB", boot)

	// Down, then up within what the VM has: the cgroup only.
	if err := update(&cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 25000, CpuShares: 256, MemoryLimitInBytes: 128 << 20}); err != nil {
		t.Fatalf("lower the limits: %v", err)
	}
	expect(t, view{"134217728", "25000 100000", "0"})
	if err := update(&cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 100000, CpuShares: 256, MemoryLimitInBytes: 384 << 20}); err != nil {
		t.Fatalf("raise the limits within the VM: %v", err)
	}
	expect(t, view{"402653184", "100000 100000", "0"})

	// Beyond the VM, within its room: it grows. A guest kernel counts the
	// hot-pluggable vCPUs as possible only when it detects a hypervisor
	// (KVM); under TCG the CPU limit is refused, saying so.
	possible, err := pod.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: ctr, Timeout: 60, Cmd: []string{"cat", "/sys/devices/system/cpu/possible"}})
	if err != nil {
		t.Fatal(err)
	}
	cpus, online := 2, "0-1"
	err = update(&cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 200000, CpuShares: 256, MemoryLimitInBytes: 384 << 20})
	if strings.TrimSpace(string(possible.Stdout)) == "0" {
		want := "a CPU limit of 2 CPUs (quota 200000 µs per period 100000 µs) needs 2 vCPUs, the pod VM has 1: the guest cannot grow: the guest kernel can use at most 1 vCPUs"
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `hypervisor.accel = "kvm"`) {
			t.Fatalf("raise the CPU limit to 2 CPUs in a guest with 1 possible CPU: %v, want a refusal saying %q", err, want)
		}
		t.Logf("no vCPU hot-plug in this guest (TCG): %v", err)
		cpus, online = 1, "0"
		expect(t, view{"402653184", "100000 100000", "0"})
	} else {
		if err != nil {
			t.Fatalf("raise the CPU limit to 2 CPUs: %v\nguest console:\n%s", err, console())
		}
		expect(t, view{"402653184", "200000 100000", "0-1"})
	}
	quota := int64(cpus) * 100000
	if err := update(&cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: quota, CpuShares: 256, MemoryLimitInBytes: 700 << 20}); err != nil {
		t.Fatalf("raise the memory limit to 700 MiB: %v\nguest console:\n%s", err, console())
	}
	cpuMax := fmt.Sprintf("%d 100000", quota)
	grown := expect(t, view{"734003200", cpuMax, online})
	if grown < boot+700 {
		t.Errorf("guest MemTotal %d MiB after the memory hot-plug, want at least %d (boot %d + 768)", grown, boot+700, boot)
	}
	t.Logf("grown: guest MemTotal %d MiB", grown)

	// Beyond the room: refused, naming the resource, the sizes and the key.
	for _, c := range []struct {
		name string
		r    *cri.LinuxContainerResources
		want []string
	}{
		{"cpu", &cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 300000, CpuShares: 256, MemoryLimitInBytes: 700 << 20},
			[]string{"a CPU limit of 3 CPUs", "needs 3 vCPUs", fmt.Sprintf("has %d and can grow to 2 (hypervisor.default_maxvcpus)", cpus)}},
		{"memory", &cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: quota, CpuShares: 256, MemoryLimitInBytes: 1536 << 20},
			[]string{"a memory limit of 1536 MiB does not fit in the pod VM's 1280 MiB", "more than hypervisor.default_maxmemory 1280 MiB"}},
	} {
		err := update(c.r)
		if err == nil {
			t.Fatalf("%s beyond the room: the update was accepted", c.name)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s refusal %q does not say %q", c.name, err, w)
			}
		}
		t.Logf("%s refused: %v", c.name, err)
	}
	expect(t, view{"734003200", cpuMax, online})

	pod.remove(t, ctr)
}
