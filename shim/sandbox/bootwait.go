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
	pid   int
	proc  string // "/proc", or a fake in tests
	start time.Time
	wait0 time.Duration
}

func newBootClock(proc string, pid int) *bootClock {
	c := &bootClock{pid: pid, proc: proc, start: time.Now()}
	c.wait0, _ = runQueueWait(proc, pid)
	return c
}

// elapsed returns the wall time since start, and that time less what QEMU
// waited for a CPU (equal when schedstat cannot be read).
func (c *bootClock) elapsed() (wall, ran time.Duration) {
	wall = time.Since(c.start)
	w, ok := runQueueWait(c.proc, c.pid)
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
func (c *bootClock) watch(ctx context.Context, cancel context.CancelCauseFunc, timeout time.Duration, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		wall, ran := c.elapsed()
		if ran > timeout || wall > bootWaitCap*timeout {
			cancel(fmt.Errorf("the guest agent did not answer within %v of the time QEMU could run (%v of wall clock, %v of it waiting for a host CPU): the guest is stuck or the node is overloaded",
				timeout, wall.Round(time.Millisecond), (wall - ran).Round(time.Millisecond)))
			return
		}
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
