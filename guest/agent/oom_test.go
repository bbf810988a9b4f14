package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

func TestOOMKilledReadsMemoryEvents(t *testing.T) {
	root := t.TempDir()
	old := cgroupRoot
	cgroupRoot = root
	t.Cleanup(func() { cgroupRoot = old })
	write := func(cg, content string) {
		t.Helper()
		dir := filepath.Join(root, cg)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "memory.events"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("c8s/killed", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
	write("c8s/limited", "low 0\nhigh 0\nmax 40\noom 2\noom_kill 0\noom_group_kill 0\n")
	write("c8s/garbled", "oom_kill x\n")
	cases := map[string]bool{
		"/c8s/killed":      true,
		"/c8s/limited":     false, // hit its limit, reclaimed, nothing killed
		"/c8s/garbled":     false,
		"/c8s/gone":        false,
		"":                 false,
		"../../c8s/killed": true, // cleaned below the root, never above
	}
	for cg, want := range cases {
		if got := oomKilled(cg); got != want {
			t.Errorf("oomKilled(%q) = %v, want %v", cg, got, want)
		}
	}
}

// TestWaitOfRemovedContainerReadsNoCgroup: once a container's removal has
// begun, its cgroup path may come to name a new container of its id: its
// WaitProcess must not report that one's OOM kill.
func TestWaitOfRemovedContainerReadsNoCgroup(t *testing.T) {
	root := t.TempDir()
	old := cgroupRoot
	cgroupRoot = root
	t.Cleanup(func() { cgroupRoot = old })
	if err := os.MkdirAll(filepath.Join(root, "c8s/x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "c8s/x/memory.events"), []byte("oom 1\noom_kill 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	close(done)
	c := &container{id: "x", cgroup: "/c8s/x", execs: map[string]*process{}, init: &process{done: done}}
	s := &Service{containers: map[string]*container{"x": c}}
	wait := func() bool {
		t.Helper()
		r, err := s.WaitProcess(context.Background(), &agentapi.ProcessRequest{ContainerId: "x"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetOomKilled()
	}
	if !wait() {
		t.Fatal("the container's own OOM kill is not reported")
	}
	c.retire()
	if wait() {
		t.Error("a container being removed reported the OOM kill its cgroup path now names")
	}
}
