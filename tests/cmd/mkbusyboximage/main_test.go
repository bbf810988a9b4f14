package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

// writeBusybox writes a stand-in busybox binary into dir.
func writeBusybox(t *testing.T, dir, body string) string {
	t.Helper()
	bb := filepath.Join(dir, "busybox")
	if err := os.WriteFile(bb, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return bb
}

func TestRunWritesNamedImage(t *testing.T) {
	dir := t.TempDir()
	bb := writeBusybox(t, dir, "fake")
	out := filepath.Join(dir, "img.tar")
	// Flags after the output path, as in the documented usage.
	if err := run([]string{out, "--name", "docker.io/c8s/cli:v1", "--busybox", bb}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("index.json not found: %v", err)
		}
		if h.Name != ocispec.ImageIndexFile {
			continue
		}
		var idx ocispec.Index
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &idx); err != nil {
			t.Fatal(err)
		}
		if got := idx.Manifests[0].Annotations[ociimage.AnnotationImageName]; got != "docker.io/c8s/cli:v1" {
			t.Errorf("image name = %q", got)
		}
		return
	}
}

// --cmd sets the image's default command: the tarball is the one the
// (deterministic) writer produces for that Cmd, and not the default image.
func TestRunSetsCmd(t *testing.T) {
	dir := t.TempDir()
	bb := writeBusybox(t, dir, "fake")
	out := filepath.Join(dir, "pause.tar")
	want := filepath.Join(dir, "want.tar")
	opts := ociimage.Options{Name: "docker.io/c8s/pause:v1", Busybox: bb, Cmd: []string{"sleep", "2147483647"}}
	if err := ociimage.WriteFile(want, opts); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain.tar")
	opts.Cmd = nil
	if err := ociimage.WriteFile(plain, opts); err != nil {
		t.Fatal(err)
	}
	wantData, _ := os.ReadFile(want)
	plainData, _ := os.ReadFile(plain)
	for _, cmd := range []string{"sleep  2147483647", ` ["sleep", "2147483647"]`} {
		if err := run([]string{out, "--name", "docker.io/c8s/pause:v1", "--busybox", bb, "--cmd", cmd}); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(out)
		if !bytes.Equal(got, wantData) || bytes.Equal(got, plainData) {
			t.Fatalf("--cmd %q did not produce the image with Cmd [sleep 2147483647] (%d bytes, want %d)", cmd, len(got), len(wantData))
		}
	}
	if err := run([]string{out, "--busybox", bb, "--cmd", `["sleep", 1]`}); err == nil {
		t.Fatal("--cmd with a malformed JSON array succeeded")
	}
}

func TestRunRejectsBadArguments(t *testing.T) {
	for _, args := range [][]string{nil, {"a.tar", "b.tar"}, {"--name"}} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// --all-applets links what the busybox binary lists: here a fake busybox
// that knows two applets gives the image those two.
func TestRunAllApplets(t *testing.T) {
	dir := t.TempDir()
	bb := writeBusybox(t, dir, "#!/bin/sh\necho nc\necho httpd\n")
	out := filepath.Join(dir, "all.tar")
	if err := run([]string{out, "--busybox", bb, "--all-applets"}); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "want.tar")
	if err := ociimage.WriteFile(want, ociimage.Options{Busybox: bb, Applets: []string{"httpd", "nc"}}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	wantData, _ := os.ReadFile(want)
	if !bytes.Equal(got, wantData) {
		t.Fatal("--all-applets did not link exactly the applets busybox --list names")
	}
}

// --hardlinks gives the image of Options.HardLinks.
func TestRunHardLinks(t *testing.T) {
	dir := t.TempDir()
	bb := writeBusybox(t, dir, "#!/bin/sh\necho nc\n")
	out := filepath.Join(dir, "hard.tar")
	if err := run([]string{out, "--busybox", bb, "--all-applets", "--hardlinks"}); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "want.tar")
	if err := ociimage.WriteFile(want, ociimage.Options{Busybox: bb, Applets: []string{"nc"}, HardLinks: true}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	wantData, _ := os.ReadFile(want)
	if !bytes.Equal(got, wantData) {
		t.Fatal("--hardlinks did not give the image with hard links")
	}
}
