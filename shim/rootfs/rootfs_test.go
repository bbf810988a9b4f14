package rootfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/internal/child"
)

func TestBuildCopiesTheDirectoryIntoAnExt4Image(t *testing.T) {
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "etc", "hostname"), []byte("pod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("etc/hostname", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "disks", "c1.img")
	if err := Build(context.Background(), nil, src, img, Options{FreeMiB: 8}); err != nil {
		t.Fatal(err)
	}
	// debugfs (e2fsprogs) reads the image without mounting it.
	out, err := exec.Command("debugfs", "-R", "cat /etc/hostname", img).Output()
	if err != nil {
		t.Fatalf("debugfs: %v", err)
	}
	if string(out) != "pod\n" {
		t.Fatalf("file in image = %q, want %q", out, "pod\n")
	}
	out, err = exec.Command("debugfs", "-R", "stat /link", img).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Fast link dest: \"etc/hostname\"") {
		t.Fatalf("symlink not preserved: %v\n%s", err, out)
	}
	if err := Build(context.Background(), nil, src, img, Options{}); err == nil {
		t.Fatal("Build over an existing image succeeded; it must refuse to clobber it")
	}
	if err := Remove(img); err != nil {
		t.Fatal(err)
	}
	if err := Remove(img); err != nil {
		t.Fatalf("removing a missing image: %v", err)
	}
}

func TestBuildFailsCleanlyForAMissingRootfs(t *testing.T) {
	img := filepath.Join(t.TempDir(), "c.img")
	err := Build(context.Background(), nil, "/nonexistent/rootfs", img, Options{})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/rootfs") {
		t.Fatalf("err = %v, want one naming the missing rootfs", err)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Fatalf("image left behind after a failed build: %v", err)
	}
}

// TestMkfsDiesWithTheShim: a shim killed while it builds a disk (SIGKILL,
// as containerd kills one) takes its mkfs.ext4 along; left reading the
// mounted snapshot, it would keep the mount, and the bundle, busy for
// `shim delete`. The shim is this test re-run as a child, whose
// mkfs.ext4 (first on its PATH) records its pid and waits.
func TestMkfsDiesWithTheShim(t *testing.T) {
	if dir := os.Getenv("C8S_ROOTFS_SHIM"); dir != "" {
		_ = Build(context.Background(), nil, dir, filepath.Join(t.TempDir(), "c1.img"), Options{})
		return
	}
	bin, src := t.TempDir(), t.TempDir()
	pidFile := filepath.Join(bin, "mkfs.pid")
	script := "#!/bin/sh\necho $$ > " + pidFile + ".tmp && mv " + pidFile + ".tmp " + pidFile + "\nexec sleep 1000\n"
	if err := os.WriteFile(filepath.Join(bin, "mkfs.ext4"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	shim := exec.Command(os.Args[0], "-test.run=^TestMkfsDiesWithTheShim$")
	shim.Env = append(os.Environ(), "C8S_ROOTFS_SHIM="+src, "PATH="+bin+":"+os.Getenv("PATH"))
	if err := shim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shim.Process.Kill(); shim.Wait() })
	var pid int
	for end := time.Now().Add(30 * time.Second); pid == 0; time.Sleep(20 * time.Millisecond) {
		if data, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		}
		if time.Now().After(end) {
			t.Fatal("the shim never ran mkfs.ext4")
		}
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	shim.Process.Kill()
	shim.Wait()
	for end := time.Now().Add(10 * time.Second); child.Running(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("mkfs.ext4 (pid %d) outlived the shim", pid)
		}
	}
}
