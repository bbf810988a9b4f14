package statedir

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// A pid file is believed only for the process whose arguments name the
// state dir: a recycled pid, here another pod's QEMU (its state dir's
// name extends this one's), is not this VM's, and a pid that is gone
// is not either.
func TestQEMUOfTheStateDir(t *testing.T) {
	root := t.TempDir()
	mine, other := filepath.Join(root, "ns", "pod-a"), filepath.Join(root, "ns", "pod-ab")
	for _, d := range []string{mine, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A stand-in QEMU that keeps its arguments: a shell waiting.
	start := func(dir string) int {
		cmd := exec.Command("sh", "-c", "sleep 1000; :", "qemu-system-x86_64", "-qmp", "unix:"+filepath.Join(dir, "qmp.sock")+",server=on,wait=off")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	writePid := func(pid int) {
		if err := os.WriteFile(filepath.Join(mine, PidFile), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, ok := QEMU("/proc", mine); ok {
		t.Fatal("a state dir without a pid file has a QEMU")
	}
	writePid(start(other))
	if pid, _, ok := QEMU("/proc", mine); ok {
		t.Fatalf("pid %d, the QEMU of another state dir, counts as this one's", pid)
	}
	own := start(mine)
	writePid(own)
	pid, args, ok := QEMU("/proc", mine)
	if !ok || pid != own || len(args) != 6 || args[4] != "-qmp" {
		t.Fatalf("the state dir's own QEMU: pid %d (want %d), args %q, %v", pid, own, args, ok)
	}
	// Gone: reaped, its pid free.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	writePid(cmd.Process.Pid)
	if _, _, ok := QEMU("/proc", mine); ok {
		t.Fatal("a pid that is gone counts as a QEMU")
	}
}
