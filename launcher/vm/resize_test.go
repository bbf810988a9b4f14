package vm

import (
	"bufio"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestGrow boots the test guest (256 MiB, 1 vCPU) with room for 512 MiB and
// 2 vCPUs and grows it: a DIMM arrives in the guest as online memory
// blocks; a vCPU is plugged into QEMU (the guest kernel uses it only under
// KVM, where it detects a hypervisor); beyond the room, nothing is plugged.
func TestGrow(t *testing.T) {
	env := newTestEnv(t)
	ctx := context.Background()
	spec := env.spec("grow")
	spec.Hypervisor.DefaultMaxVCPUs, spec.Hypervisor.DefaultMaxMemoryMiB = 2, 512
	v, err := Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = v.Stop(context.Background()) })
	if got, want := v.Size(), (Size{VCPUs: 1, MaxVCPUs: 2, MemoryMiB: 256, MaxMemoryMiB: 512}); got != want {
		t.Fatalf("Size = %+v, want %+v", got, want)
	}
	waitFor(t, "the guest's marker in console.log", func() bool {
		b, _ := os.ReadFile(v.ConsolePath())
		return strings.Contains(string(b), guestReady)
	})
	conn, err := v.DialAgent(ctx)
	if err != nil {
		t.Fatalf("DialAgent: %v", err)
	}
	defer conn.Close()
	sh := &agentShell{conn: conn, r: bufio.NewReader(conn)}
	// Memory in online blocks, MiB.
	online := func() int {
		out := sh.run(t, `n=0; for b in /sys/devices/system/memory/memory*; do [ "$(cat $b/state)" = online ] && n=$((n+1)); done; echo $(( n * $(printf %d 0x$(cat /sys/devices/system/memory/block_size_bytes)) >> 20 ))`)
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("online memory: %q", out)
		}
		return n
	}
	before := online()

	// 300 MiB: one DIMM of 128 MiB (whole memory blocks).
	if err := v.GrowMemory(ctx, 300); err != nil {
		t.Fatalf("GrowMemory: %v", err)
	}
	if got := v.Size(); got.MemoryMiB != 384 {
		t.Fatalf("Size after GrowMemory(300) = %+v, want 384 MiB", got)
	}
	waitFor(t, "the hot-plugged memory online in the guest", func() bool { return online() >= before+128 })
	if err := v.GrowMemory(ctx, 200); err != nil || v.Size().MemoryMiB != 384 {
		t.Fatalf("GrowMemory to less than the VM has: %v, %+v", err, v.Size())
	}
	if err := v.GrowMemory(ctx, 600); err == nil || !strings.Contains(err.Error(), "at most 512 MiB (hypervisor.default_maxmemory)") {
		t.Fatalf("GrowMemory beyond the room: %v", err)
	}

	if err := v.GrowVCPUs(ctx, 2); err != nil {
		t.Fatalf("GrowVCPUs: %v", err)
	}
	var cpus []hotpluggableCPU
	if err := v.qmp.Execute(ctx, "query-hotpluggable-cpus", nil, &cpus); err != nil {
		t.Fatal(err)
	}
	plugged := 0
	for _, c := range cpus {
		if c.QOMPath != "" {
			plugged++
		}
	}
	if plugged != 2 || v.Size().VCPUs != 2 {
		t.Fatalf("after GrowVCPUs(2): %d vCPUs plugged in QEMU, Size %+v", plugged, v.Size())
	}
	if err := v.GrowVCPUs(ctx, 3); err == nil || !strings.Contains(err.Error(), "at most 2 (hypervisor.default_maxvcpus)") {
		t.Fatalf("GrowVCPUs beyond the room: %v", err)
	}
	if _, err := v.MigrationSpec(); err == nil || !strings.Contains(err.Error(), "hot-plug") {
		t.Fatalf("MigrationSpec of a VM with hot-plug room: %v", err)
	}
}
