package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func writeSchedstat(t *testing.T, proc string, tid, line string) {
	t.Helper()
	dir := filepath.Join(proc, "42", "task", tid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "schedstat"), []byte(line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRunQueueWaitBusiestThread(t *testing.T) {
	proc := t.TempDir()
	writeSchedstat(t, proc, "42", "1000 5000 3")   // main loop: little CPU
	writeSchedstat(t, proc, "43", "900000 777 10") // the vCPU
	w, ok := runQueueWait(proc, 42)
	if !ok || w != 777 {
		t.Fatalf("runQueueWait = %v, %v; want 777ns of the busiest thread", w, ok)
	}
	if _, ok := runQueueWait(proc, 7); ok {
		t.Fatal("a process without schedstat reads as known")
	}
}

// A guest starved of host CPU keeps its deadline; one that runs and does
// not answer loses it.
func TestBootClockDiscountsRunQueueWait(t *testing.T) {
	proc := t.TempDir()
	writeSchedstat(t, proc, "43", "1 0 1")
	c := newBootClock(proc, 42)
	c.start = time.Now().Add(-10 * time.Second)
	writeSchedstat(t, proc, "43", "2 9000000000 2")
	wall, ran := c.elapsed()
	if wall < 10*time.Second || ran > wall-9*time.Second+time.Second || ran < wall-9*time.Second {
		t.Fatalf("elapsed = %v wall, %v ran; want the 9s of waiting off", wall, ran)
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	// 1s of ran time, a 3s timeout: not cancelled.
	done := make(chan struct{})
	go func() { c.watch(ctx, cancel, 3*time.Second, 5*time.Millisecond); close(done) }()
	select {
	case <-done:
		t.Fatalf("watch gave up on a starved guest: %v", context.Cause(ctx))
	case <-time.After(100 * time.Millisecond):
	}
	// Less of the time was waiting: the guest ran 4s, past its timeout.
	writeSchedstat(t, proc, "43", "3 6000000000 3")
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not give up on a guest that ran past its timeout")
	}
	if err := context.Cause(ctx); err == nil || !strings.Contains(err.Error(), "could run") {
		t.Fatalf("cause = %v", err)
	}
}

func TestBootClockWallCap(t *testing.T) {
	proc := t.TempDir()
	writeSchedstat(t, proc, "43", "1 0 1")
	c := newBootClock(proc, 42)
	c.start = time.Now().Add(-11 * time.Second)
	writeSchedstat(t, proc, "43", "2 10900000000 2") // waited 10.9s of 11s
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	c.watch(ctx, cancel, 2*time.Second, time.Millisecond) // cap 10s: gives up
	if context.Cause(ctx) == nil {
		t.Fatal("no cause")
	}
}

// A guest that answers before its timeout costs no read of /proc: QEMU
// cannot have run longer than the wall clock. Once the timeout has passed,
// reads come only when the time left could have run out, not on a tick.
func TestBootClockReadsOnlyWhenTheTimeoutCouldHavePassed(t *testing.T) {
	var mu sync.Mutex
	reads := 0
	count := func() int { mu.Lock(); defer mu.Unlock(); return reads }
	const timeout, waited = 400 * time.Millisecond, 300 * time.Millisecond
	start := time.Now()
	c := &bootClock{start: start, wait: func() (time.Duration, bool) {
		mu.Lock()
		defer mu.Unlock()
		reads++
		return waited, true // QEMU waited 300ms for a CPU (by the first read)
	}}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan struct{})
	go func() { c.watch(ctx, cancel, timeout, time.Millisecond); close(done) }()
	time.Sleep(timeout / 2)
	if n := count(); n != 0 {
		t.Fatalf("%d reads of the run-queue wait before the timeout could have passed", n)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not give up on a guest that ran past its timeout")
	}
	// It gave up once QEMU could have run past the timeout, the wait off,
	// after a read at the timeout and one when the time left ran out (a
	// tick of 1ms would have read hundreds of times).
	if took := time.Since(start); took < timeout+waited {
		t.Fatalf("watch gave up after %v, before QEMU could have run %v (%v of waiting off)", took, timeout, waited)
	}
	if n := count(); n < 1 || n > 3 {
		t.Fatalf("%d reads of the run-queue wait; want 2 (one at the timeout, one when the time left ran out)", n)
	}
	if err := context.Cause(ctx); err == nil || !strings.Contains(err.Error(), "could run") {
		t.Fatalf("cause = %v", err)
	}
}
