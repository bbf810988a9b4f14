package agent

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// StartContainer of a layered container answers only once the started
// process runs its own program, not the runtime's any more (an exec that
// fails on a corrupted layer must fail the start): the wait ends as the
// exec comes, without a fixed tick.
func TestAwaitLayeredStartWaitsForTheExec(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "sleep 0.2; exec /bin/sleep 5")
	ec, err := testReaper.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	p := &process{pid: cmd.Process.Pid, done: make(chan struct{})}
	defer func() {
		_ = cmd.Process.Kill()
		_, _ = testReaper.Wait(cmd, ec)
	}()
	before := exeOf(p.pid)
	if before == "" {
		t.Fatal("cannot read the process's program")
	}
	s := &Service{cfg: Config{LayerDevices: newFakeLayerDevices()}}
	c := &container{id: "c1", layers: []*layer{{digest: "sha256:00", users: map[string]bool{"c1": true}}}}
	start := time.Now()
	if err := s.awaitLayeredStart(context.Background(), c, p, before); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if now := exeOf(p.pid); now == before {
		t.Fatalf("returned after %v with the process still running %s: the exec was not waited for", took, now)
	}
	if took > 2*time.Second {
		t.Errorf("took %v for an exec 200ms away", took)
	}
}
