package sharedfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const debianVirtiofsd = "/usr/lib/qemu/virtiofsd"

func TestShareLifecycle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for bind mounts")
	}
	if _, err := os.Stat(debianVirtiofsd); err != nil {
		t.Fatalf("%s: %v (qemu-system-common)", debianVirtiofsd, err)
	}
	dir := filepath.Join(t.TempDir(), "fs")
	s, err := Start(context.Background(), debianVirtiofsd, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if fi, err := os.Stat(s.Socket()); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("virtiofsd socket: %v %v", fi, err)
	}

	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "f"), []byte("from the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(host, "vol-rw", false); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(host, "vol-ro", true); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(filepath.Join(host, "f"), "file", true); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(host, "vol-rw", false); err == nil {
		t.Fatal("the same name was shared twice")
	}
	if err := s.Add(host, "../escape", false); err == nil {
		t.Fatal("a name with a path was accepted")
	}
	shared := filepath.Join(dir, "shared")
	for _, p := range []string{"vol-rw/f", "vol-ro/f", "file"} {
		if b, err := os.ReadFile(filepath.Join(shared, p)); err != nil || string(b) != "from the host" {
			t.Fatalf("%s: %q %v", p, b, err)
		}
	}
	if err := os.WriteFile(filepath.Join(shared, "vol-rw", "g"), []byte("x"), 0o644); err != nil {
		t.Fatalf("write through the read-write share: %v", err)
	}
	if _, err := os.Stat(filepath.Join(host, "g")); err != nil {
		t.Fatalf("a write through the share is not on the host: %v", err)
	}
	if err := os.WriteFile(filepath.Join(shared, "vol-ro", "h"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write through the read-only share: %v, want EROFS", err)
	}

	if err := s.Remove("vol-rw"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(shared, "vol-rw")); !os.IsNotExist(err) {
		t.Fatalf("vol-rw after Remove: %v", err)
	}
	pid := s.cmd.Process.Pid
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("share dir after Close: %v", err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("virtiofsd (pid %d) still runs after Close", pid)
	}
	if _, err := os.Stat(filepath.Join(host, "f")); err != nil {
		t.Fatalf("Close touched the host directory: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestStartWithoutDaemon(t *testing.T) {
	if _, err := Start(context.Background(), "/nonexistent/virtiofsd", t.TempDir()); err == nil {
		t.Fatal("Start without a daemon succeeded")
	}
}

func TestStartRefusesTooLongASocketPath(t *testing.T) {
	daemon := filepath.Join(t.TempDir(), "virtiofsd") // never started
	if err := os.WriteFile(daemon, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := "/" + strings.Repeat("d", 100)
	if _, err := Start(context.Background(), daemon, dir); err == nil || !strings.Contains(err.Error(), "too long for a unix socket (116 > 107 bytes)") {
		t.Fatalf("Start in %s: %v", dir, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Start left %s: %v", dir, err)
	}
}

func TestCleanupAfterADeadShim(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for bind mounts")
	}
	dir := filepath.Join(t.TempDir(), "fs")
	s, err := Start(context.Background(), debianVirtiofsd, dir)
	if err != nil {
		t.Fatal(err)
	}
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(host, "vol", false); err != nil {
		t.Fatal(err)
	}
	// The shim dies: its virtiofsd goes, the mount stays.
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	if err := Cleanup(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("share dir after Cleanup: %v", err)
	}
	if _, err := os.Stat(filepath.Join(host, "keep")); err != nil {
		t.Fatalf("Cleanup touched the host directory: %v", err)
	}
	if err := Cleanup(dir); err != nil {
		t.Fatalf("Cleanup of nothing: %v", err)
	}
}
