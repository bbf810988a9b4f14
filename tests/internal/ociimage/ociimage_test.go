package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

// fakeBusybox writes a stand-in binary so that unit tests do not depend on
// the host's busybox.
func fakeBusybox(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(p, []byte("#!fake busybox\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func readTar(t *testing.T, data []byte) (map[string][]byte, map[string]*tar.Header, []string) {
	t.Helper()
	files := map[string][]byte{}
	headers := map[string]*tar.Header{}
	var order []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, headers, order
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name], headers[h.Name] = body, h
		order = append(order, h.Name)
	}
}

func decodeBlob(t *testing.T, files map[string][]byte, d ocispec.Descriptor, v any) []byte {
	t.Helper()
	blob, ok := files["blobs/sha256/"+d.Digest.Encoded()]
	if !ok {
		t.Fatalf("blob %s missing", d.Digest)
	}
	if digest.FromBytes(blob) != d.Digest || int64(len(blob)) != d.Size {
		t.Fatalf("blob %s does not match its descriptor", d.Digest)
	}
	if v != nil {
		if err := json.Unmarshal(blob, v); err != nil {
			t.Fatal(err)
		}
	}
	return blob
}

// gunzipBlob returns the uncompressed content of a gzip layer blob.
func gunzipBlob(t *testing.T, files map[string][]byte, d ocispec.Descriptor) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(decodeBlob(t, files, d, nil)))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return layer
}

func TestWriteLayout(t *testing.T) {
	bb := fakeBusybox(t)
	var out bytes.Buffer
	if err := Write(&out, Options{Name: "docker.io/c8s/busybox:unit", Busybox: bb}); err != nil {
		t.Fatal(err)
	}
	files, _, _ := readTar(t, out.Bytes())
	if got := string(files["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %s", got)
	}
	var index ocispec.Index
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(index.Manifests))
	}
	ann := index.Manifests[0].Annotations
	if ann[AnnotationImageName] != "docker.io/c8s/busybox:unit" || ann[ocispec.AnnotationRefName] != "unit" {
		t.Errorf("index annotations = %v", ann)
	}
	var m ocispec.Manifest
	decodeBlob(t, files, index.Manifests[0], &m)
	var cfg ocispec.Image
	decodeBlob(t, files, m.Config, &cfg)
	if strings.Join(cfg.Config.Cmd, " ") != "sh" || !strings.HasPrefix(cfg.Config.Env[0], "PATH=") || cfg.OS != "linux" {
		t.Errorf("config = %+v", cfg.Config)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != ocispec.MediaTypeImageLayerGzip {
		t.Fatalf("layers = %+v", m.Layers)
	}
	layer := gunzipBlob(t, files, m.Layers[0])
	if digest.FromBytes(layer) != cfg.RootFS.DiffIDs[0] {
		t.Errorf("diff ID %s does not match the uncompressed layer", cfg.RootFS.DiffIDs[0])
	}
	lfiles, lheaders, _ := readTar(t, layer)
	if string(lfiles["bin/busybox"]) != "#!fake busybox\n" || lheaders["bin/busybox"].Mode != 0o755 {
		t.Errorf("bin/busybox missing or wrong mode")
	}
	for _, a := range []string{"sh", "echo", "cat", "sleep", "uname", "true", "false", "ls", "id", "env", "ps", "hostname"} {
		h := lheaders["bin/"+a]
		if h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
			t.Errorf("bin/%s is not a symlink to busybox: %+v", a, h)
		}
	}
	if !strings.HasPrefix(string(lfiles["etc/passwd"]), "root:x:0:0:") || !strings.HasPrefix(string(lfiles["etc/group"]), "root:x:0:") {
		t.Errorf("user database missing")
	}
	for name, h := range lheaders {
		if h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != 0 {
			t.Errorf("%s: uid %d gid %d mtime %v", name, h.Uid, h.Gid, h.ModTime)
		}
	}
}

func TestWriteIsDeterministic(t *testing.T) {
	bb := fakeBusybox(t)
	var a, b bytes.Buffer
	if err := Write(&a, Options{Busybox: bb}); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, Options{Busybox: bb}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two writes with the same options differ")
	}
	var c bytes.Buffer
	if err := Write(&c, Options{Busybox: bb, Name: "docker.io/c8s/other:x"}); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a.Bytes(), c.Bytes()) {
		t.Error("the name does not reach the output")
	}
}

func TestWriteRejectsBadInput(t *testing.T) {
	if err := Write(io.Discard, Options{Busybox: filepath.Join(t.TempDir(), "missing")}); err == nil ||
		!strings.Contains(err.Error(), "busybox-static") {
		t.Errorf("missing busybox: %v", err)
	}
	if err := Write(io.Discard, Options{Busybox: fakeBusybox(t), Name: "busybox"}); err == nil {
		t.Error("a short name was accepted")
	}
}

func TestTagOf(t *testing.T) {
	for ref, want := range map[string]string{
		"docker.io/c8s/busybox:test":            "test",
		"localhost:5000/busybox":                "latest",
		"docker.io/c8s/busybox:v1@sha256:abcd":  "v1",
		"registry.example:443/a/b/c:1.2.3-rc.1": "1.2.3-rc.1",
	} {
		if got := tagOf(ref); got != want {
			t.Errorf("tagOf(%q) = %q, want %q", ref, got, want)
		}
	}
}

// TestImportAndRunWithContainerd imports the real busybox image into a
// private containerd and runs containers from it with runc. It leaves one
// container running and checks that the helper's cleanup ends it.
func TestImportAndRunWithContainerd(t *testing.T) {
	if _, err := os.Stat(DefaultBusybox); err != nil {
		containerdtest.SkipOrFail(t, "%s missing: run make deps", DefaultBusybox)
	}
	var dir string
	var shimPID int
	t.Run("daemon", func(t *testing.T) {
		d := containerdtest.Start(t, containerdtest.Options{})
		dir = d.Dir
		tarball := filepath.Join(t.TempDir(), "busybox.tar")
		if err := WriteFile(tarball, Options{}); err != nil {
			t.Fatal(err)
		}
		d.Ctr(t, "images", "import", tarball)
		if out := d.Ctr(t, "images", "ls", "--quiet"); !strings.Contains(out, DefaultName) {
			t.Fatalf("image %s not listed after import: %s", DefaultName, out)
		}
		out := runOutput(t, d, "t1", "echo", "hi")
		if out != "hi\n" {
			t.Errorf("ctr run echo hi printed %q", out)
		}
		out = runOutput(t, d, "t2", "sh", "-c", "id -u; ls /bin/sh; hostname >/dev/null && echo ok")
		if got := strings.Fields(out); len(got) != 3 || got[0] != "0" || got[1] != "/bin/sh" || got[2] != "ok" {
			t.Errorf("applets in the container printed %q", out)
		}
		d.Ctr(t, "run", "--detach", DefaultName, "left-running", "sleep", "600")
		fields := strings.Fields(d.Ctr(t, "tasks", "ls"))
		if len(fields) < 6 || fields[3] != "left-running" || fields[5] != "RUNNING" {
			t.Fatalf("tasks ls: %q", fields)
		}
		shimPID = processMentioning(t, dir)
	})
	if dir == "" {
		return
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after cleanup (%v)", dir, err)
	}
	if shimPID == 0 {
		t.Fatal("no shim process found while the container ran")
	}
	if pid := processMentioning(t, dir); pid != 0 {
		t.Errorf("process %d started by the test daemon is still running", pid)
	}
}

// runOutput runs a container of the image to its end with `ctr run --rm`
// and returns what it printed (stdout and stderr).
//
// The output goes to a file the shim writes: ctr's own stdout can lose the
// last lines. ctr deletes the task once the exit event arrives, and the
// containerd client's Delete cancels the task's IO, which closes ctr's
// ends of the stdout and stderr FIFOs before waiting for their copies, so
// output still in a FIFO when the exit arrives is dropped (CI saw "ok" go
// missing). With a log file, the shim's Delete drains the container's
// pipes into the file before it returns, and ctr returns after that.
func runOutput(t *testing.T, d *containerdtest.Daemon, id string, args ...string) string {
	t.Helper()
	log := filepath.Join(t.TempDir(), id+".log")
	if out := d.Ctr(t, append([]string{"run", "--rm", "--log-uri", "file://" + log, DefaultName, id}, args...)...); out != "" {
		t.Errorf("ctr run %s printed %q on its own stdout, want it all in the log", id, out)
	}
	out, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// processMentioning returns a live (non-zombie) process whose command line
// contains s, or 0.
func processMentioning(t *testing.T, s string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			return pid
		}
	}
	return 0
}

// Options.Applets replaces the default applet links: each named applet is
// linked once, busybox itself and names with a slash are not.
func TestWriteLinksChosenApplets(t *testing.T) {
	var out bytes.Buffer
	if err := Write(&out, Options{Busybox: fakeBusybox(t), Applets: []string{"sh", "nc", "nc", "busybox", "../x"}}); err != nil {
		t.Fatal(err)
	}
	headers, order := layerHeaders(t, out.Bytes())
	var links []string
	for _, name := range order {
		if headers[name].Typeflag == tar.TypeSymlink {
			links = append(links, name)
		}
	}
	if strings.Join(links, " ") != "bin/nc bin/sh" || headers["bin/busybox"].Typeflag != tar.TypeReg {
		t.Fatalf("applet links = %v, bin/busybox type %c; want bin/nc bin/sh and the binary", links, headers["bin/busybox"].Typeflag)
	}
}

// Options.HardLinks links the applets to bin/busybox with hard links, as
// the upstream busybox image does: masking one applet's path then masks
// that applet alone.
func TestWriteHardLinks(t *testing.T) {
	var out bytes.Buffer
	if err := Write(&out, Options{Busybox: fakeBusybox(t), Applets: []string{"sh", "ls"}, HardLinks: true}); err != nil {
		t.Fatal(err)
	}
	headers, order := layerHeaders(t, out.Bytes())
	var links []string
	for _, name := range order {
		if h := headers[name]; h.Typeflag == tar.TypeLink && h.Linkname == "bin/busybox" {
			links = append(links, name)
		} else if h.Typeflag == tar.TypeSymlink {
			t.Errorf("%s is a symbolic link", name)
		}
	}
	if strings.Join(links, " ") != "bin/ls bin/sh" || slices.Index(order, "bin/busybox") > slices.Index(order, "bin/ls") {
		t.Fatalf("hard links = %v in order %v; want bin/ls bin/sh after bin/busybox", links, order)
	}
}

// layerHeaders returns the tar headers of the single layer of an image
// layout tarball, by name and in order.
func layerHeaders(t *testing.T, image []byte) (map[string]*tar.Header, []string) {
	t.Helper()
	files, _, _ := readTar(t, image)
	var index ocispec.Index
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	decodeBlob(t, files, index.Manifests[0], &m)
	_, headers, order := readTar(t, gunzipBlob(t, files, m.Layers[0]))
	return headers, order
}

// Options.User sets the config's user; Passwd and Group add lines to the
// user database (critest's image whose user belongs to a group of its
// own); a line that is not one is refused.
func TestWriteUserDatabase(t *testing.T) {
	var out bytes.Buffer
	opts := Options{Busybox: fakeBusybox(t), User: "1000", Passwd: []string{"default-user:x:1000:1000::/home:/bin/sh"}, Group: []string{"default-user:x:1000:", "group-defined-in-image:x:50000:default-user"}}
	if err := Write(&out, opts); err != nil {
		t.Fatal(err)
	}
	files, _, _ := readTar(t, out.Bytes())
	var index ocispec.Index
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	decodeBlob(t, files, index.Manifests[0], &m)
	var cfg ocispec.Image
	decodeBlob(t, files, m.Config, &cfg)
	if cfg.Config.User != "1000" {
		t.Errorf("config user %q", cfg.Config.User)
	}
	layer, _, _ := readTar(t, gunzipBlob(t, files, m.Layers[0]))
	if g := string(layer["etc/group"]); !strings.HasSuffix(g, "nogroup:x:65534:\ndefault-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n") {
		t.Errorf("/etc/group:\n%s", g)
	}
	if p := string(layer["etc/passwd"]); !strings.HasSuffix(p, "\ndefault-user:x:1000:1000::/home:/bin/sh\n") {
		t.Errorf("/etc/passwd:\n%s", p)
	}
	opts.Group = []string{"two\nlines:x:1:"}
	if err := Write(&out, opts); err == nil {
		t.Error("a group line with a newline was written")
	}
}
