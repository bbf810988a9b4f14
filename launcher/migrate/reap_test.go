package migrate

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/internal/child"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// TestServeReapsWhatAnEarlierServerLeft: the VMs that migrated to a
// server that died are unknown to the one that starts after it. Their
// QEMUs die with a server now; one still running (left by a server that
// did not have them die with it) is stopped, and each one's state dir,
// which would refuse a later migration of the same pod, is removed. A
// second server on the same state dir is refused while the first serves.
func TestServeReapsWhatAnEarlierServerLeft(t *testing.T) {
	root := t.TempDir()
	left := statedir.Incoming(root, "pod1")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	qemu := exec.Command("sh", "-c", "sleep 1000; :", "qemu", "-qmp", "unix:"+filepath.Join(left, "qmp.sock")+",server=on,wait=off")
	qemu.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its sleep goes with it
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-qemu.Process.Pid, syscall.SIGKILL); qemu.Wait() })
	if err := os.WriteFile(filepath.Join(left, statedir.PidFile), []byte(strconv.Itoa(qemu.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	serve := func(ctx context.Context) <-chan error {
		l, err := net.Listen("unix", filepath.Join(t.TempDir(), "api.sock"))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- (&Server{Config: config.Config{Runtime: config.Runtime{StateDir: root}}, Name: "node-b"}).Serve(ctx, l)
		}()
		return done
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := serve(ctx)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := os.Stat(left)
		if os.IsNotExist(err) && !child.Running(qemu.Process.Pid) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the earlier server's VM is left: state dir %v, QEMU running %v", err, child.Running(qemu.Process.Pid))
		}
	}
	select {
	case err := <-serve(context.Background()):
		if err == nil || !strings.Contains(err.Error(), "another migration server serves") {
			t.Fatalf("a second server on the same state dir: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a second server on the same state dir serves too")
	}
	cancel()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// An incoming VM's QEMU dies with the server that started it: a server
// that starts again knows none of them.
func TestIncomingVMDiesWithTheServer(t *testing.T) {
	s := &Server{Config: config.Config{Runtime: config.Runtime{StateDir: t.TempDir()}}}
	spec, err := s.incomingSpec("pod1", statedir.Incoming(s.Config.Runtime.StateDir, "pod1"), Shape{VCPUs: 1, MemoryMiB: 512}, "", "tcg")
	if err != nil {
		t.Fatal(err)
	}
	if !spec.DieWithParent || !spec.Incoming {
		t.Fatalf("incoming spec: DieWithParent %v, Incoming %v", spec.DieWithParent, spec.Incoming)
	}
}
