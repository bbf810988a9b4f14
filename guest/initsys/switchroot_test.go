package initsys

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCopyTreeKeepsFilesLinksAndModes(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "usr/bin/runc"), []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(src, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "skip"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "skip/x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := copyTree(src, dst, filepath.Join(src, "skip")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "usr/bin/runc"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("runc not copied with its mode: %v %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "bin")); err != nil || l != "usr/bin" {
		t.Fatalf("symlink = %q, %v", l, err)
	}
	if _, err := os.Stat(filepath.Join(dst, "skip")); !os.IsNotExist(err) {
		t.Fatalf("skipped dir was copied: %v", err)
	}
}
