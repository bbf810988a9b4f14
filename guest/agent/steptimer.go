package agent

import (
	"context"
	"sync"
	"time"

	"github.com/containerd/log"
)

// stepTimer times the steps of one request, each from the end of the one
// before, for a single log line at its end: the guest's own account of
// where a container's create and start spend their time (the host's trace,
// shim/task/trace.go, sees only the requests' round trips). A step marked
// more than once (one per layer) adds up. Code below the request marks its
// own steps through the context (withSteps, markStep).
type stepTimer struct {
	mu          sync.Mutex
	start, last time.Time
	fields      log.Fields
}

func newStepTimer() *stepTimer {
	now := time.Now()
	return &stepTimer{start: now, last: now, fields: log.Fields{}}
}

// mark ends step name. A nil timer ignores it.
func (t *stepTimer) mark(name string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	d := now.Sub(t.last).Milliseconds()
	if v, ok := t.fields[name+"_ms"].(int64); ok {
		d += v
	}
	t.fields[name+"_ms"] = d
	t.last = now
}

// log writes the steps marked so far and the total.
func (t *stepTimer) log(ctx context.Context, id, msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	log.G(ctx).WithFields(t.fields).WithField("container", id).
		WithField("total_ms", time.Since(t.start).Milliseconds()).Info(msg)
}

type stepsKey struct{}

// withSteps carries t to the code a request calls.
func withSteps(ctx context.Context, t *stepTimer) context.Context {
	return context.WithValue(ctx, stepsKey{}, t)
}

// markStep ends step name of the request's timer, if it has one.
func markStep(ctx context.Context, name string) {
	t, _ := ctx.Value(stepsKey{}).(*stepTimer)
	t.mark(name)
}
