package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The agent's deadline counts the time the guest could run, not the wall
// clock: on a node starting many pods at once (or busy with other work),
// QEMU's vCPU thread waits for a host CPU for much of its boot, and a pod
// that a wall-clock deadline fails would have booted in time on an idle
// node. The time QEMU's busiest thread spent waiting on a run queue
// (/proc/PID/task/TID/schedstat, second field) is taken off the clock. A
// guest that hangs still fails after timeout; one starved by the host gets
// up to bootWaitCap times it.
const bootWaitCap = 5

// bootClock measures the time since start that QEMU (pid) could run.
type bootClock struct {
	start time.Time
	wait0 time.Duration
	// wait reads QEMU's run-queue wait so far (runQueueWait).
	wait func() (time.Duration, bool)
}

func newBootClock(proc string, pid int) *bootClock {
	c := &bootClock{start: time.Now(), wait: func() (time.Duration, bool) { return runQueueWait(proc, pid) }}
	c.wait0, _ = c.wait()
	return c
}

// elapsed returns the wall time since start, and that time less what QEMU
// waited for a CPU (equal when schedstat cannot be read).
func (c *bootClock) elapsed() (wall, ran time.Duration) {
	wall = time.Since(c.start)
	w, ok := c.wait()
	if !ok || w < c.wait0 {
		return wall, wall
	}
	ran = wall - (w - c.wait0)
	if ran < 0 {
		ran = 0
	}
	return wall, ran
}

// watch cancels ctx (with the reason) once the time QEMU could run exceeds
// timeout, or the wall clock exceeds bootWaitCap times it. It returns when
// ctx ends.
//
// QEMU cannot have run for longer than the wall clock, so watch reads
// /proc only once timeout has passed, and after that only when the time
// QEMU could still run before either limit could be used up: a guest that
// answers in time costs no read at all, a starved one a few. (A fixed
// tick read every QEMU thread's schedstat 4 times a second for the whole
// boot, which is most of a boot's wall time on a loaded node, the one
// where the shims' CPU is the pods' loss.) floor is the least time
// between two reads.
func (c *bootClock) watch(ctx context.Context, cancel context.CancelCauseFunc, timeout time.Duration, floor time.Duration) {
	next := timeout - time.Since(c.start)
	for {
		t := time.NewTimer(max(next, floor))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wall, ran := c.elapsed()
		if ran > timeout || wall > bootWaitCap*timeout {
			cancel(fmt.Errorf("the guest agent did not answer within %v of the time QEMU could run (%v of wall clock, %v of it waiting for a host CPU): the guest is stuck or the node is overloaded",
				timeout, wall.Round(time.Millisecond), (wall - ran).Round(time.Millisecond)))
			return
		}
		// Both clocks advance at most as fast as the wall clock.
		next = min(timeout-ran, bootWaitCap*timeout-wall)
	}
}

// runQueueWait returns the run-queue wait of the thread of pid that has run
// the longest (under TCG, the vCPU's).
func runQueueWait(proc string, pid int) (time.Duration, bool) {
	tasks, err := filepath.Glob(filepath.Join(proc, strconv.Itoa(pid), "task", "*", "schedstat"))
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var best, wait uint64
	found := false
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		f := strings.Fields(string(data))
		if len(f) < 2 {
			continue
		}
		run, err1 := strconv.ParseUint(f[0], 10, 64)
		w, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if !found || run > best {
			best, wait, found = run, w, true
		}
	}
	return time.Duration(wait), found
}
