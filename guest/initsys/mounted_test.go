package initsys

import (
	"os"
	"testing"
)

// TestMounted tells a mount point from a directory of its parent's file
// system, which is how MountAll and Mount leave an API file system that is
// there already alone (a second proc, sysfs or devtmpfs mount would stack,
// not fail).
func TestMounted(t *testing.T) {
	if _, err := os.Stat("/proc/self"); err != nil {
		t.Fatalf("this test needs /proc mounted: %v", err)
	}
	if !mounted("/proc") {
		t.Error("/proc is not seen as a mount point")
	}
	for _, dir := range []string{"/proc/self", t.TempDir(), "/nonexistent"} {
		if mounted(dir) {
			t.Errorf("%s is seen as a mount point", dir)
		}
	}
}

func TestMountRefusesWhatIsNotAnAPIFileSystem(t *testing.T) {
	if err := Mount("/etc"); err == nil {
		t.Fatal("Mount(/etc) mounted something")
	}
}
