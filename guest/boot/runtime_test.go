package boot

import (
	"io/fs"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// The guest falls back to runc only for an image without crun. A crun the
// host made unreadable (a corrupted block of the verified root fails with
// EIO) stays the runtime, so that creates fail, rather than let the host
// choose the other runtime, whose behaviour the policy was not written for.
func TestMaliciousHostCorruptsCrun(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"crun present", nil, "/usr/bin/crun"},
		{"no crun in the image", &fs.PathError{Op: "stat", Path: "/usr/bin/crun", Err: fs.ErrNotExist}, "/usr/bin/runc"},
		{"crun unreadable", &fs.PathError{Op: "stat", Path: "/usr/bin/crun", Err: unix.EIO}, "/usr/bin/crun"},
	} {
		rt := ociRuntime(nil, func(string) (os.FileInfo, error) { return nil, tc.err })
		if rt.Command != tc.want {
			t.Errorf("%s: runtime %s, want %s", tc.name, rt.Command, tc.want)
		}
	}
}
