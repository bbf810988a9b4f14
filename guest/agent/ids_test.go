package agent

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// Ids the host names containers and execs by: nothing that climbs out of
// the state directory, reads as an option to the OCI runtime, or writes
// lines of the host's into the guest's log; container ids as containerd
// allows them.
func TestMaliciousHostIDs(t *testing.T) {
	for _, tc := range []struct {
		kind, id string
		ok       bool
	}{
		{"container id", strings.Repeat("ab12", 16), true}, // CRI's
		{"container id", "app1", true},
		{"container id", "c8s-e2e.pod_1", true},
		{"container id", strings.Repeat("a", 77), false},
		{"container id", "-rf", false},
		{"container id", "a\nlevel=info msg=\"policy off\"", false},
		{"container id", "a:b", false},
		{"container id", "a..b", false},
		{"container id", "../x", false},
		{"container id", "", false},
		{"exec id", "e1", true},
		{"exec id", "probe:1", true},
		{"exec id", "-x", false},
		{"exec id", "e\r", false},
		{"exec id", "a/b", false},
		{"exec id", "..", false},
		{"exec id", "e\x00", false},
	} {
		err := validID(tc.kind, tc.id)
		if tc.ok && err != nil || !tc.ok && !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s %q: %v, want ok=%v", tc.kind, tc.id, err, tc.ok)
		}
	}
}
