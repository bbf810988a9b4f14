package agent

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

// Each step is timed from the end of the one before, and the line names
// the container, every step marked and the total.
func TestStepTimer(t *testing.T) {
	var buf bytes.Buffer
	l := logrus.New()
	l.SetOutput(&buf)
	l.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true, DisableColors: true})
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(l))

	st := newStepTimer()
	time.Sleep(20 * time.Millisecond)
	st.mark("slow")
	st.mark("fast")
	st.log(ctx, "c1", "container create steps")

	if got := st.fields["slow_ms"].(int64); got < 20 {
		t.Errorf("slow_ms = %d, want >= 20", got)
	}
	if got := st.fields["fast_ms"].(int64); got >= 20 {
		t.Errorf("fast_ms = %d: a step counted the one before it", got)
	}
	line := buf.String()
	for _, want := range []string{`msg="container create steps"`, "container=c1", "slow_ms=", "fast_ms=", "total_ms="} {
		if !strings.Contains(line, want) {
			t.Errorf("log line %q lacks %q", line, want)
		}
	}
}

// A step marked again (one per layer) adds up; code below the request
// marks through the context, and a context without a timer ignores it.
func TestStepTimerAddsUpThroughContext(t *testing.T) {
	st := newStepTimer()
	ctx := withSteps(context.Background(), st)
	time.Sleep(10 * time.Millisecond)
	markStep(ctx, "layer_disk")
	st.mark("other")
	time.Sleep(10 * time.Millisecond)
	markStep(ctx, "layer_disk")
	if got := st.fields["layer_disk_ms"].(int64); got < 20 {
		t.Errorf("layer_disk_ms = %d, want >= 20 (two marks of 10ms)", got)
	}
	markStep(context.Background(), "nothing") // no timer: no panic
}
