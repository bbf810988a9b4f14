package agent

import (
	"errors"
	"testing"

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
