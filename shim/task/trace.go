package task

import (
	"context"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/shim/sandbox"
)

// shimStarted is when this shim process began (near enough: its package
// initialization), the start of the pod's trace as the shim sees it.
var shimStarted = time.Now()

// TraceMessage is the message of the debug log line that carries a pod's
// start trace (`make bench` reads it from containerd's log).
const TraceMessage = "pod start trace"

// podTrace records the phases of the life of the container that started
// the pod's VM, from the shim's start to the VM's teardown, and logs them
// as one debug line once the VM is gone. It is display only: nothing
// decides on it.
type podTrace struct {
	mu        sync.Mutex
	container string
	// marks are the ends of the phases, in order.
	marks []traceMark
	boot  *sandbox.BootTimes
	done  bool
}

type traceMark struct {
	phase string
	at    time.Time
}

// newTrace starts a trace at the shim's start, with the first phase
// ending now (the shim's own start and containerd's Create).
func newTrace() *podTrace {
	t := &podTrace{marks: []traceMark{{"shim_start", shimStarted}}}
	t.mark("shim_to_create")
	return t
}

// mark ends phase now. A nil trace, or one already logged, ignores it.
func (t *podTrace) mark(phase string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.done {
		t.marks = append(t.marks, traceMark{phase, time.Now()})
	}
}

// markFor ends phase if id is the traced container.
func (t *podTrace) markFor(id, phase string) {
	if t == nil || t.container != id {
		return
	}
	t.mark(phase)
}

// setBoot records the VM's own account of its start.
func (t *podTrace) setBoot(sb Sandbox) {
	if t == nil {
		return
	}
	b, ok := sb.(interface{ BootTimes() sandbox.BootTimes })
	if !ok {
		return
	}
	bt := b.BootTimes()
	t.mu.Lock()
	t.boot = &bt
	t.mu.Unlock()
}

// fields returns each phase's duration in milliseconds (a phase that
// repeats, such as an exec's, adds up), the total from the shim's start,
// and the VM's boot steps.
func (t *podTrace) fields() log.Fields {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := log.Fields{"container": t.container}
	for i := 1; i < len(t.marks); i++ {
		k := t.marks[i].phase + "_ms"
		d := t.marks[i].at.Sub(t.marks[i-1].at).Milliseconds()
		if v, ok := f[k].(int64); ok {
			d += v
		}
		f[k] = d
	}
	if n := len(t.marks); n > 1 {
		f["total_ms"] = t.marks[n-1].at.Sub(t.marks[0].at).Milliseconds()
	}
	if t.boot != nil {
		for k, v := range t.boot.Fields() {
			f[k] = v
		}
	}
	return f
}

// log writes the trace once, at debug level.
func (t *podTrace) log(ctx context.Context) {
	if t == nil {
		return
	}
	t.mark("teardown")
	f := t.fields()
	t.mu.Lock()
	already := t.done
	t.done = true
	t.mu.Unlock()
	if !already {
		log.G(ctx).WithFields(f).Debug(TraceMessage)
	}
}
