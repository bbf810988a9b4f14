package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/spec"
)

// lookUpSubmounts looks up only clean paths below the shared directory,
// never through a symlink (the host names them, and writes the share).
func TestLookUpSubmountsStaysBelow(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a/b", "c"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/", filepath.Join(dir, "s")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", filepath.Join(dir, "toa")); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	got := lookUpSubmounts(fd, []string{"a/b", "../etc", "/etc", "s", "s/etc", "toa/b", "a/../c", "a/", "missing", "c", "", ".."})
	if want := []string{"a/b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("looked up %q, want %q", got, want)
	}
	many := make([]string, maxSubmounts+5)
	for i := range many {
		many[i] = "c"
	}
	if got := lookUpSubmounts(fd, many); len(got) != maxSubmounts {
		t.Fatalf("%d lookups of %d names, want at most %d", len(got), len(many), maxSubmounts)
	}
}

// TestMaliciousHostAnnouncesWritableSubmount: the host announces a
// writable mount below a volume the policy requires read-only; looked up
// before the runtime's read-only bind (which is not recursive), it would
// stay writable, an outlet the policy closes. Under a policy the agent
// looks none up; without one it does (CRI's non-recursive read-only).
func TestMaliciousHostAnnouncesWritableSubmount(t *testing.T) {
	m := &agentapi.SharedMount{Source: "/host/vol", Name: "c-1", Submounts: []string{"out"}}
	if got := (&Service{}).submountLookups(m); !slices.Equal(got, []string{"out"}) {
		t.Fatalf("without a policy: %q, want the host's submounts", got)
	}
	doc := policyDoc(t, "")
	svc := snpService(t, doc)
	svc.secrets = []secretMount{{resource: "kbs:///default/key/db", source: "/x", destination: "/run/secrets/db"}} // fetched already
	if _, err := svc.SetInitData(ctxT(t), &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatal(err)
	}
	if got := svc.submountLookups(m); got != nil {
		t.Fatalf("under a policy the agent looks up %q", got)
	}
}

// Under a policy a staged share is bound alone, whatever recursion its
// options ask for (crun takes a recursive propagation option as a
// recursive bind), and with its flags applied recursively at once.
func TestFlattenShared(t *testing.T) {
	ms := []specs.Mount{
		{Destination: "/config", Type: "bind", Source: "/s/c-0", Options: []string{"rbind", "rprivate", "ro", "nosuid", "nodev"}},
		{Destination: "/data", Type: "bind", Source: "/s/c-1", Options: []string{"rbind", "rslave", "nosuid", "nodev"}},
		{Destination: "/etc/hosts", Type: "bind", Source: "/f/0", Options: []string{"rbind", "rprivate", "ro"}},
	}
	flattenShared(ms, []spec.MountOrigin{spec.OriginShared, spec.OriginShared, spec.OriginHostFile})
	for i, want := range [][]string{
		{"bind", "private", "ro", "nosuid", "nodev", "rro", "rnosuid", "rnodev"},
		{"bind", "slave", "nosuid", "nodev", "rnosuid", "rnodev"},
		{"rbind", "rprivate", "ro"},
	} {
		if !slices.Equal(ms[i].Options, want) {
			t.Errorf("%s: options %q, want %q", ms[i].Destination, ms[i].Options, want)
		}
	}
}
