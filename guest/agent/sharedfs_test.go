package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
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
