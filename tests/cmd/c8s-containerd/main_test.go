package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

// TestStartStop starts a daemon as the scripts do, talks to it through the
// printed socket, and stops it from its directory alone.
func TestStartStop(t *testing.T) {
	if os.Geteuid() != 0 {
		containerdtest.SkipOrFail(t, "containerd needs root")
	}
	tools := containerdtest.ToolsBin(t)
	var out bytes.Buffer
	if err := run([]string{"start", "--namespace", "cli", "--tools-bin", tools, "--log-level", "warn"}, &out); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || len(v) < 2 || v[0] != '\'' || v[len(v)-1] != '\'' {
			t.Fatalf("not a quoted shell assignment: %q", line)
		}
		vars[k] = v[1 : len(v)-1]
	}
	dir := vars["CD_DIR"]
	pid, err := strconv.Atoi(vars["CD_PID"])
	if dir == "" || err != nil || vars["CD_NAMESPACE"] != "cli" || vars["CD_SOCK"] != dir+"/containerd.sock" {
		t.Fatalf("start printed %v", vars)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = run([]string{"stop", "--dir", dir}, nil)
		}
	})
	d, err := containerdtest.Attach(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if b, err := d.CtrCommand(ctx, "namespaces", "create", "made-here").CombinedOutput(); err != nil {
		t.Fatalf("ctr against the printed socket: %v: %s", err, b)
	}

	if err := run([]string{"stop", "--dir", dir}, nil); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("stop left %s: %v", dir, err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		stat, _ := os.ReadFile("/proc/" + vars["CD_PID"] + "/stat")
		if !strings.Contains(string(stat), ") Z") {
			t.Errorf("containerd (pid %d) still runs after stop", pid)
		}
	}
	if err := run([]string{"stop", "--dir", dir}, nil); err == nil {
		t.Error("stop of a directory without a daemon succeeded")
	}
}
