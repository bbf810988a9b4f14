package agent

import (
	"context"
	"time"

	"github.com/containerd/log"
)

// stepTimer times the steps of one request, each from the end of the one
// before, for a single log line at its end: the guest's own account of
// where a container's create and start spend their time (the host's trace,
// shim/task/trace.go, sees only the requests' round trips).
type stepTimer struct {
	start, last time.Time
	fields      log.Fields
}

func newStepTimer() *stepTimer {
	now := time.Now()
	return &stepTimer{start: now, last: now, fields: log.Fields{}}
}

// mark ends step name.
func (t *stepTimer) mark(name string) {
	now := time.Now()
	t.fields[name+"_ms"] = now.Sub(t.last).Milliseconds()
	t.last = now
}

// log writes the steps marked so far and the total.
func (t *stepTimer) log(ctx context.Context, id, msg string) {
	log.G(ctx).WithFields(t.fields).WithField("container", id).
		WithField("total_ms", time.Since(t.start).Milliseconds()).Info(msg)
}
