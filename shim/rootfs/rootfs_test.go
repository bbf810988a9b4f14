package rootfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
