package manager

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/internal/child"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

func TestGroupOfUsesThePodAnnotation(t *testing.T) {
	dir := t.TempDir()
	write := func(json string) string {
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, []byte(json), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct{ spec, want string }{
		{`{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1"}}`, "pod1"},
		{`{"annotations":{"io.containerd.c8s.v2.group":"g","io.kubernetes.cri.sandbox-id":"pod1"}}`, "g"},
		{`{"annotations":{"other":"x"}}`, "c1"},
		{`{}`, "c1"},
	}
	for _, c := range cases {
		got, err := groupOf("c1", write(c.spec))
		if err != nil || got != c.want {
			t.Errorf("groupOf(%s) = %q, %v; want %q", c.spec, got, err, c.want)
		}
	}
	if _, err := groupOf("c1", write(`{not json`)); err == nil {
		t.Error("malformed spec accepted")
	}
}

// TestStopKillsOnlyItsOwnQEMU: `shim delete` after a dead shim finds the
// QEMU by the pid file in the VM's state dir. That QEMU died with its shim
// (PDEATHSIG), so the pid may be another pod's QEMU by now: it must live.
// The state dir's own QEMU (its arguments name the dir) is killed.
func TestStopKillsOnlyItsOwnQEMU(t *testing.T) {
	root := t.TempDir()
	mine, other := filepath.Join(root, "ns", "pod1"), filepath.Join(root, "ns", "pod2")
	// A stand-in QEMU: a shell under QEMU's name, waiting with QEMU's
	// arguments.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sh)
	if err != nil {
		t.Fatal(err)
	}
	qemu := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	if err := os.WriteFile(qemu, data, 0o755); err != nil {
		t.Fatal(err)
	}
	start := func(dir string) *exec.Cmd {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(qemu, "-c", "sleep 1000; :", "qemu", "-qmp", "unix:"+filepath.Join(dir, "qmp.sock")+",server=on,wait=off")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	alive := func(cmd *exec.Cmd) bool { return child.Running(cmd.Process.Pid) }
	otherQEMU := start(other)
	if err := os.MkdirAll(mine, 0o755); err != nil {
		t.Fatal(err)
	}
	writePid := func(pid int) {
		if err := os.WriteFile(filepath.Join(mine, statedir.PidFile), []byte(strconv.Itoa(pid)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writePid(otherQEMU.Process.Pid) // recycled: now another pod's QEMU
	killVM(context.Background(), mine)
	if !alive(otherQEMU) {
		t.Fatal("shim delete killed another pod's QEMU through a recycled pid")
	}
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Fatalf("the state dir is left: %v", err)
	}
	own := start(mine)
	writePid(own.Process.Pid)
	done := make(chan error, 1)
	go func() { done <- own.Wait() }()
	killVM(context.Background(), mine)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the state dir's own QEMU still runs")
	}
	if !alive(otherQEMU) {
		t.Fatal("the other pod's QEMU died")
	}
}
