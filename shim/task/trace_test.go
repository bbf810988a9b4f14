package task

import (
	"testing"
	"time"

	"github.com/c8s-dev/c8s/shim/sandbox"
)

type bootTimer struct {
	Sandbox
	bt sandbox.BootTimes
}

func (b bootTimer) BootTimes() sandbox.BootTimes { return b.bt }

func TestPodTraceFields(t *testing.T) {
	t0 := time.Unix(100, 0)
	tr := &podTrace{container: "c1", marks: []traceMark{{"shim_start", t0}}}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tr.marks = append(tr.marks,
		traceMark{"shim_to_create", at(30)}, traceMark{"config", at(35)}, traceMark{"vm_start", at(2035)},
		traceMark{"run", at(2100)}, traceMark{"run", at(2150)})
	tr.setBoot(bootTimer{bt: sandbox.BootTimes{Spawn: 40 * time.Millisecond}})
	f := tr.fields()
	for k, v := range map[string]int64{"shim_to_create_ms": 30, "config_ms": 5, "vm_start_ms": 2000, "run_ms": 115, "total_ms": 2150, "qemu_spawn_ms": 40} {
		if f[k] != v {
			t.Errorf("%s = %v, want %d", k, f[k], v)
		}
	}
	if f["container"] != "c1" {
		t.Errorf("container = %v", f["container"])
	}
}

func TestPodTraceMarkFor(t *testing.T) {
	tr := newTrace()
	tr.container = "c1"
	tr.markFor("c2", "start")
	tr.markFor("c1", "start")
	if n := len(tr.marks); n != 3 {
		t.Fatalf("marks %v: want shim_start, shim_to_create, start", tr.marks)
	}
	if tr.marks[2].phase != "start" {
		t.Fatalf("last mark %q, want start", tr.marks[2].phase)
	}
	var nilTrace *podTrace
	nilTrace.mark("x") // a pod without a trace ignores marks
	nilTrace.markFor("c1", "x")
	tr.done = true
	tr.mark("late")
	if len(tr.marks) != 3 {
		t.Fatalf("a logged trace took a mark: %v", tr.marks)
	}
}
