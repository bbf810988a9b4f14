package agent

import (
	"os"
	"path/filepath"
	"testing"
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
