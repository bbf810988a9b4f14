package initsys

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The host makes a container's process dump core (SIGQUIT, a crash) with
// its working directory on a disk or share the host reads: besides the
// containers' RLIMIT_CORE 0 (guest/spec), the guest's core_pattern pipes
// dumps to a program that discards them, fs.suid_dumpable is 0, and PID 1
// passes a hard RLIMIT_CORE of 0 to everything it starts.
func TestMaliciousHostCoreDumpDiscarded(t *testing.T) {
	procSys := t.TempDir()
	for _, f := range []string{"kernel/core_pattern", "fs/suid_dumpable"} {
		p := filepath.Join(procSys, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("core-a-long-default-pattern"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := DisableCoreDumps(procSys); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"kernel/core_pattern": "|/bin/false", "fs/suid_dumpable": "0"} {
		got, err := os.ReadFile(filepath.Join(procSys, f))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", f, got, err, want)
		}
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_CORE, &rl); err != nil || rl.Cur != 0 || rl.Max != 0 {
		t.Errorf("RLIMIT_CORE = %+v, %v; want 0/0", rl, err)
	}
	// A kernel without core dumps has no core_pattern: nothing to do.
	if err := DisableCoreDumps(t.TempDir()); err != nil {
		t.Errorf("without the sysctls: %v", err)
	}
}
