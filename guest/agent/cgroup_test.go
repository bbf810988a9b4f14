package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/containerd/errdefs"
)

// statsDir names the container's own cgroup only: a path that would name
// the hierarchy's root (none set yet, "/", one climbing out) is refused as
// not there yet, and a hierarchy that is not cgroup v2 as unsupported.
func TestStatsDir(t *testing.T) {
	root := t.TempDir() // not cgroup2
	old := cgroupRoot
	cgroupRoot = root
	t.Cleanup(func() { cgroupRoot = old })
	for _, cg := range []string{"", "/", "..", "/c8s/../..", "."} {
		if dir, err := statsDir(&container{id: "x", cgroup: cg}); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("cgroup %q: statsDir = %q, %v; want ErrUnavailable", cg, dir, err)
		}
	}
	if dir, err := statsDir(&container{id: "x", cgroup: "/c8s/x"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("cgroup /c8s/x below a directory that is not cgroup2: statsDir = %q, %v; want ErrFailedPrecondition", dir, err)
	}
}

func TestInCgroup(t *testing.T) {
	v2 := []byte("0::/c8s/app/sub\n")
	v1 := []byte("9:name=systemd:/\n8:pids:/c8s/app\n4:memory:/c8s/app\n")
	for _, tc := range []struct {
		data   []byte
		cgroup string
		want   bool
	}{
		{v2, "/c8s/app", true},
		{v2, "c8s/app", true},
		{v2, "/c8s/app/sub", true},
		{v2, "/c8s/ap", false},
		{v2, "/c8s/other", false},
		{v1, "/c8s/app", true},
		{v1, "/c8s/app2", false},
		{[]byte("garbage\n"), "/c8s/app", false},
	} {
		if got := inCgroup(tc.data, tc.cgroup); got != tc.want {
			t.Errorf("inCgroup(%q, %q) = %v, want %v", tc.data, tc.cgroup, got, tc.want)
		}
	}
}

// A pid listed in a container's cgroup.procs can be reaped by its parent in
// the container and given to a new process elsewhere in the VM before the
// signal goes out: signalMember signals it only while it is in the cgroup.
func TestMaliciousHostSignalReachesOnlyTheCgroup(t *testing.T) {
	c := exec.Command("sleep", "100")
	ec, err := testReaper.Start(c)
	if err != nil {
		t.Fatal(err)
	}
	pid := c.Process.Pid
	t.Cleanup(func() {
		_ = c.Process.Kill()
		_, _ = testReaper.Wait(c, ec)
	})
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The cgroup the process is in ("/" on a host whose tests run there).
	own := "/"
	if _, rest, ok := strings.Cut(strings.Split(string(data), "\n")[0], ":"); ok {
		_, own, _ = strings.Cut(rest, ":")
	}
	if err := signalMember(pid, "/c8s/another-container", unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	select {
	case e := <-ec:
		t.Fatalf("a process outside the cgroup was signalled: %+v", e)
	default:
	}
	if err := signalMember(pid, own, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if status, _ := testReaper.Wait(c, ec); status != 128+int(unix.SIGTERM) {
		t.Errorf("status %d, want %d: the process of the cgroup was not signalled", status, 128+int(unix.SIGTERM))
	}
	// Reaped: its number is no one's any more.
	if err := signalMember(pid, own, unix.SIGKILL); err != nil {
		t.Errorf("signalMember of a reaped pid: %v", err)
	}
}
