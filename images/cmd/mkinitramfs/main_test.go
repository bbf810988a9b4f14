package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/c8s-dev/c8s/internal/newc"
)

func TestRunArchivesTreeAndDevices(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "init"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "a.cpio")
	if err := run([]string{"-root", root, "-o", out, "-mtime", "7", "-chardev", "/dev/console:0600:5:1"}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := newc.ReadAll(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 || entries[0].Name != "dev" || entries[1].Name != "init" || entries[2].Name != "dev/console" {
		t.Fatalf("entries = %+v", entries)
	}
	c := entries[2]
	if c.Mode != newc.ModeCharDev|0o600 || c.RdevMajor != 5 || c.RdevMinor != 1 || c.MTime != 7 {
		t.Errorf("dev/console = %+v", c)
	}
}

func TestRunRejectsBadArguments(t *testing.T) {
	root := t.TempDir()
	out := filepath.Join(t.TempDir(), "a.cpio")
	for _, args := range [][]string{
		{"-o", out},
		{"-root", root},
		{"-root", root, "-o", out, "-chardev", "dev/console:0600:5"},
		{"-root", root, "-o", out, "-chardev", "dev/console:99999:5:1"},
		{"-root", root, "-o", out, "-chardev", "dev/console:0600:x:1"},
		{"-root", root, "-o", out, "-mtime", "99999999999"},
	} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
