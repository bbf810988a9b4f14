package newc

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stage builds a small tree; perm and mtime vary to show that the archive
// does not depend on them beyond permission bits.
func stage(t *testing.T, mtime time.Time) string {
	t.Helper()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755))
	must(os.Mkdir(filepath.Join(root, "tmp"), 0o755))
	must(os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky))
	must(os.WriteFile(filepath.Join(root, "init"), []byte("#!init\n"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/bin/tool"), []byte("abc"), 0o755))
	must(os.Symlink("tool", filepath.Join(root, "usr/bin/alias")))
	for _, p := range []string{"usr/bin/tool", "usr/bin", "usr", "init", "tmp"} {
		must(os.Chtimes(filepath.Join(root, p), mtime, mtime))
	}
	return root
}

func archive(t *testing.T, root string) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := WriteTree(w, root, 1700000000); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Entry{Name: "dev/console", Mode: ModeCharDev | 0o600, RdevMajor: 5, RdevMinor: 1, MTime: 1700000000}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d is not 4-byte aligned", buf.Len())
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	data := archive(t, stage(t, time.Unix(1, 0)))
	entries, err := ReadAll(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	byName := map[string]Entry{}
	for i, e := range entries {
		names = append(names, e.Name)
		byName[e.Name] = e
		if e.UID != 0 || e.GID != 0 || e.MTime != 1700000000 || e.inode != uint32(i+1) {
			t.Errorf("%s: uid %d gid %d mtime %d inode %d", e.Name, e.UID, e.GID, e.MTime, e.inode)
		}
	}
	want := "init tmp usr usr/bin usr/bin/alias usr/bin/tool dev/console"
	if strings.Join(names, " ") != want {
		t.Errorf("order = %q, want %q", strings.Join(names, " "), want)
	}
	checks := []struct {
		name  string
		mode  uint32
		body  string
		links uint32
	}{
		{"init", ModeRegular | 0o755, "#!init\n", 1},
		{"tmp", ModeDir | 0o1777, "", 2},
		{"usr/bin", ModeDir | 0o755, "", 2},
		{"usr/bin/alias", ModeSymlink | 0o777, "tool", 1},
		{"usr/bin/tool", ModeRegular | 0o755, "abc", 1},
		{"dev/console", ModeCharDev | 0o600, "", 1},
	}
	for _, c := range checks {
		e := byName[c.name]
		if e.Mode != c.mode || string(e.Body) != c.body || e.Links() != c.links {
			t.Errorf("%s: mode %o body %q links %d, want %o %q %d", c.name, e.Mode, e.Body, e.Links(), c.mode, c.body, c.links)
		}
	}
	if c := byName["dev/console"]; c.RdevMajor != 5 || c.RdevMinor != 1 {
		t.Errorf("dev/console is %d:%d", c.RdevMajor, c.RdevMinor)
	}
}

func TestArchiveIgnoresHostTimes(t *testing.T) {
	a := archive(t, stage(t, time.Unix(1, 0)))
	b := archive(t, stage(t, time.Unix(2000000000, 0)))
	if !bytes.Equal(a, b) {
		t.Error("archives of trees that differ only in host mtimes differ")
	}
}

// TestGNUCpioReadsArchive checks the format against an independent reader.
func TestGNUCpioReadsArchive(t *testing.T) {
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio not installed (make deps)")
	}
	data := archive(t, stage(t, time.Unix(1, 0)))
	cmd := exec.Command(cpio, "--quiet", "-itv")
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -itv: %v\n%s", err, out)
	}
	for _, want := range []string{"usr/bin/alias -> tool", "5,   1", "dev/console", "drwxrwxrwt"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cpio listing lacks %q:\n%s", want, out)
		}
	}
	cmd = exec.Command(cpio, "--quiet", "-i", "--to-stdout", "usr/bin/tool")
	cmd.Stdin = bytes.NewReader(data)
	if out, err := cmd.Output(); err != nil || string(out) != "abc" {
		t.Errorf("cpio extract usr/bin/tool = %q, %v", out, err)
	}
}

func TestRejects(t *testing.T) {
	w := NewWriter(&bytes.Buffer{})
	for _, name := range []string{"", "/abs", "a/../../b", ".."} {
		if err := w.Write(Entry{Name: name, Mode: ModeRegular}); err == nil {
			t.Errorf("name %q accepted", name)
		}
	}
	if err := w.Write(Entry{Name: "sock", Mode: 0o140000}); err == nil {
		t.Error("socket type accepted")
	}
	root := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteTree(NewWriter(&bytes.Buffer{}), root, 0); err == nil {
		t.Error("WriteTree accepted a FIFO")
	}
	data := archive(t, stage(t, time.Unix(1, 0)))
	if _, err := ReadAll(bytes.NewReader(data[:len(data)-20])); !errors.Is(err, ErrTruncated) {
		t.Errorf("truncated archive: %v", err)
	}
	if _, err := ReadAll(strings.NewReader("070702" + strings.Repeat("0", 104))); err == nil {
		t.Error("bad magic accepted")
	}
}
