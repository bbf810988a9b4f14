package manager

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/internal/child"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/shim/task"
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

// standInQEMU starts a stand-in for the QEMU of the VM whose state dir is
// dir: a shell under QEMU's name, waiting with QEMU's arguments naming the
// dir (statedir.QEMU's test), and not yet in its pid file.
func standInQEMU(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
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
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(qemu, "-c", "sleep 1000; :", "qemu", "-qmp", "unix:"+filepath.Join(dir, "qmp.sock")+",server=on,wait=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its sleep goes with it
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	return cmd
}

// waitGone reports whether cmd ends within d.
func waitGone(cmd *exec.Cmd, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if !child.Running(cmd.Process.Pid) {
			return true
		}
	}
	return false
}

// TestStopKillsOnlyItsOwnQEMU: `shim delete` after a dead shim finds the
// QEMU by the pid file in the VM's state dir. That QEMU died with its shim
// (PDEATHSIG), so the pid may be another pod's QEMU by now: it must live.
// The state dir's own QEMU (its arguments name the dir) is killed.
func TestStopKillsOnlyItsOwnQEMU(t *testing.T) {
	root := t.TempDir()
	mine, other := filepath.Join(root, "ns", "pod1"), filepath.Join(root, "ns", "pod2")
	start := func(dir string) *exec.Cmd { return standInQEMU(t, dir) }
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

// TestStopLeavesALiveShimsPod: containerd runs `shim delete` whenever it
// closes a task's connection, also after a Delete the live shim answered
// (the pod's sandbox task deleted while other containers run on). While
// the shim that wrote the bundle runs, the pod is its own: its QEMU, state
// dir (the agent's and QMP's sockets) and layer references stay, and only
// the container's disk goes. Once that shim is gone, all of it goes.
func TestStopLeavesALiveShimsPod(t *testing.T) {
	for _, shimAlive := range []bool{true, false} {
		t.Run(map[bool]string{true: "shim alive", false: "shim gone"}[shimAlive], func(t *testing.T) {
			root := t.TempDir()
			stateDir := filepath.Join(root, "run", "ns", "pod1")
			if err := os.MkdirAll(stateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			qemu := standInQEMU(t, stateDir)
			if err := os.WriteFile(filepath.Join(stateDir, statedir.PidFile), []byte(strconv.Itoa(qemu.Process.Pid)), 0o600); err != nil {
				t.Fatal(err)
			}
			cache, err := layercache.Open(filepath.Join(root, "layers"))
			if err != nil {
				t.Fatal(err)
			}
			ref, err := layercache.PodRef("ns", "pod1", stateDir)
			if err != nil {
				t.Fatal(err)
			}
			d := digest.FromString("layer")
			if _, _, err := cache.Acquire(context.Background(), d, ref, func(_ context.Context, out *os.File) (layercache.Meta, error) {
				_, err := out.Write([]byte("x"))
				return layercache.Meta{DiffID: d}, err
			}); err != nil {
				t.Fatal(err)
			}
			disk := filepath.Join(root, "disks", "ns", "pod1", "c1.img")
			if err := os.MkdirAll(filepath.Dir(disk), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(disk, []byte("disk"), 0o600); err != nil {
				t.Fatal(err)
			}
			// The shim: a process that runs, or one that ran and is gone.
			shim := exec.Command("sleep", "1000")
			if err := shim.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { shim.Process.Kill(); shim.Wait() })
			start, err := child.StartTime(shim.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if !shimAlive {
				shim.Process.Kill()
				shim.Wait()
			}
			st := task.BundleState{Sandbox: "pod1", StateDir: stateDir, Disk: disk, LayerCache: cache.Dir(), LayerRef: ref.Name,
				ShimPid: shim.Process.Pid, ShimStart: start}
			bundle := filepath.Join(root, "bundles", "pod1")
			if err := os.MkdirAll(bundle, 0o700); err != nil {
				t.Fatal(err)
			}
			data, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(bundle, "c8s.json"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			t.Chdir(bundle)
			if _, err := (manager{}).Stop(context.Background(), "pod1"); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(disk); !os.IsNotExist(err) {
				t.Errorf("the container's disk is left: %v", err)
			}
			_, stateErr := os.Stat(stateDir)
			live := 0
			ls, err := cache.List()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range ls {
				live += l.LiveRefs()
			}
			if shimAlive {
				time.Sleep(200 * time.Millisecond)
				if !child.Running(qemu.Process.Pid) || stateErr != nil || live != 1 {
					t.Fatalf("with its shim running, the pod was torn down: QEMU running %v, state dir %v, live layer references %d",
						child.Running(qemu.Process.Pid), stateErr, live)
				}
				return
			}
			if !waitGone(qemu, 10*time.Second) || !os.IsNotExist(stateErr) || live != 0 {
				t.Fatalf("with its shim gone, the pod is left: QEMU gone %v, state dir %v, live layer references %d",
					!child.Running(qemu.Process.Pid), stateErr, live)
			}
		})
	}
}
