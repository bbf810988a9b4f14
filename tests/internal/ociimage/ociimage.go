// Package ociimage writes a small, deterministic OCI image layout tarball for
// tests: one gzip layer holding Debian's static busybox with symlinks (or hard
// links) for the common applets, /etc/passwd and /etc/group; config Cmd ["sh"]. The tarball
// can be imported with `ctr images import`, since tests cannot reach a
// registry. Equal inputs give byte-identical output.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // registers sha256 for go-digest
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// DefaultName is the image name used when Options.Name is empty.
const DefaultName = "docker.io/c8s/busybox:test"

// DefaultBusybox is where Debian's busybox-static installs the binary.
const DefaultBusybox = "/bin/busybox"

// AnnotationImageName is the index annotation containerd reads the image
// name from on import.
const AnnotationImageName = "io.containerd.image.name"

// Applets are the busybox applets linked into /bin.
var Applets = []string{
	"[", "awk", "basename", "cat", "chmod", "chown", "cp", "cut", "date", "dd", "df",
	"dirname", "du", "echo", "env", "false", "find", "free", "grep", "head", "hostname",
	"id", "ip", "kill", "ln", "ls", "mkdir", "mount", "mv", "nproc", "printf", "ps",
	"pwd", "readlink", "rm", "rmdir", "sed", "seq", "sh", "sleep", "sort", "stat",
	"sync", "tail", "tee", "test", "top", "touch", "tr", "true", "umount", "uname",
	"uniq", "wc", "whoami", "xargs", "yes",
}

// Env is the image's environment.
var Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// Options selects what Write produces.
type Options struct {
	// Name is the full image reference, e.g. docker.io/c8s/busybox:test.
	Name string
	// Busybox is the path of a static busybox binary (DefaultBusybox).
	Busybox string
	// Created is the timestamp of every file and of the config (zero: the
	// Unix epoch).
	Created time.Time
	// Cmd is the image's default command (empty: ["sh"]). A pause image
	// for CRI sandboxes is this image with a command that never exits.
	Cmd []string
	// Applets are the applets linked into /bin (empty: Applets). Images
	// for suites that expect a full busybox pass `busybox --list`.
	Applets []string
	// HardLinks links the applets to /bin/busybox with hard links, as the
	// upstream busybox image does, rather than symbolic links. A masked
	// path (/dev/null bound over /bin/ls) then masks that applet alone; a
	// symbolic link would be followed and mask busybox, every applet.
	HardLinks bool
	// User is the config's default user ("" for root). Passwd and Group
	// are lines added to /etc/passwd and /etc/group (an image whose user
	// belongs to groups of its own, say).
	User          string
	Passwd, Group []string
}

func (o Options) withDefaults() Options {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.Busybox == "" {
		o.Busybox = DefaultBusybox
	}
	if len(o.Cmd) == 0 {
		o.Cmd = []string{"sh"}
	}
	if len(o.Applets) == 0 {
		o.Applets = Applets
	}
	if o.Created.IsZero() {
		o.Created = time.Unix(0, 0)
	}
	o.Created = o.Created.UTC()
	return o
}

// tagOf returns the tag of a reference ("latest" without one), which is
// what the OCI ref.name annotation holds.
func tagOf(ref string) string {
	name := ref
	if i := strings.LastIndex(name, "@"); i >= 0 {
		name = name[:i]
	}
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		return name[i+1:]
	}
	return "latest"
}

// WriteFile writes the image layout tarball to path.
func WriteFile(path string, opts Options) error {
	var buf bytes.Buffer
	if err := Write(&buf, opts); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// Write writes the image layout tarball to w.
func Write(w io.Writer, opts Options) error {
	opts = opts.withDefaults()
	if strings.ContainsAny(opts.Name, " \t\n") || !strings.Contains(opts.Name, "/") {
		return fmt.Errorf("image name %q is not a full reference like %s", opts.Name, DefaultName)
	}
	bb, err := os.ReadFile(opts.Busybox)
	if err != nil {
		return fmt.Errorf("read busybox: %w (install busybox-static: make deps)", err)
	}
	for _, l := range slices.Concat(opts.Passwd, opts.Group) {
		if strings.ContainsAny(l, "\n") || strings.Count(l, ":") < 3 {
			return fmt.Errorf("user database line %q is not one line of name:x:... fields", l)
		}
	}
	layerTar, err := rootfsTar(bb, opts, opts.Created)
	if err != nil {
		return err
	}
	layer, err := gzipBytes(layerTar)
	if err != nil {
		return err
	}
	layerDesc := ocispec.Descriptor{
		MediaType: ocispec.MediaTypeImageLayerGzip,
		Digest:    digest.FromBytes(layer),
		Size:      int64(len(layer)),
	}
	created := opts.Created
	config, err := json.Marshal(ocispec.Image{
		Created:  &created,
		Platform: ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"},
		Config:   ocispec.ImageConfig{Env: Env, Cmd: opts.Cmd, User: opts.User},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layerTar)}},
	})
	if err != nil {
		return err
	}
	configDesc := ocispec.Descriptor{
		MediaType: ocispec.MediaTypeImageConfig,
		Digest:    digest.FromBytes(config),
		Size:      int64(len(config)),
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    []ocispec.Descriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	platform := ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"}
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{
			MediaType: ocispec.MediaTypeImageManifest,
			Digest:    digest.FromBytes(manifest),
			Size:      int64(len(manifest)),
			Platform:  &platform,
			Annotations: map[string]string{
				ocispec.AnnotationRefName: tagOf(opts.Name),
				AnnotationImageName:       opts.Name,
			},
		}},
	})
	if err != nil {
		return err
	}
	layout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return err
	}

	blobs := map[string][]byte{}
	for _, b := range [][]byte{layer, config, manifest} {
		blobs["blobs/sha256/"+digest.FromBytes(b).Encoded()] = b
	}
	tw := newTarWriter(w, opts.Created)
	tw.dir("blobs")
	tw.dir("blobs/sha256")
	for _, name := range slices.Sorted(maps.Keys(blobs)) {
		tw.file(name, 0o644, blobs[name])
	}
	tw.file(ocispec.ImageLayoutFile, 0o644, layout)
	tw.file(ocispec.ImageIndexFile, 0o644, index)
	return tw.close()
}

// rootfsTar returns the uncompressed layer: the directory skeleton, busybox,
// its applet links and the user database.
func rootfsTar(busybox []byte, opts Options, mtime time.Time) ([]byte, error) {
	applets, hard := opts.Applets, opts.HardLinks
	var buf bytes.Buffer
	tw := newTarWriter(&buf, mtime)
	for _, d := range []string{"bin", "dev", "etc", "proc", "root", "sys", "tmp", "usr", "usr/bin", "var"} {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		} else if d == "root" {
			mode = 0o700
		}
		tw.dirMode(d, mode)
	}
	tw.file("bin/busybox", 0o755, busybox)
	for _, a := range slices.Compact(slices.Sorted(slices.Values(applets))) {
		if a == "" || a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if hard {
			tw.hardlink(path.Join("bin", a), "bin/busybox")
		} else {
			tw.symlink(path.Join("bin", a), "busybox")
		}
	}
	tw.file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"+lines(opts.Group)))
	tw.file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"+lines(opts.Passwd)))
	if err := tw.close(); err != nil {
		return nil, fmt.Errorf("build layer: %w", err)
	}
	return buf.Bytes(), nil
}

func gzipBytes(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	// The gzip header carries no name and a zero mtime, so output is stable.
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarWriter writes entries owned by root with a fixed mtime, remembering the
// first error.
type tarWriter struct {
	tw    *tar.Writer
	mtime time.Time
	err   error
}

func newTarWriter(w io.Writer, mtime time.Time) *tarWriter {
	return &tarWriter{tw: tar.NewWriter(w), mtime: mtime}
}

func (t *tarWriter) header(h *tar.Header, body []byte) {
	if t.err != nil {
		return
	}
	h.ModTime = t.mtime
	h.Format = tar.FormatPAX
	if t.err = t.tw.WriteHeader(h); t.err == nil && len(body) > 0 {
		_, t.err = t.tw.Write(body)
	}
}

func (t *tarWriter) dir(name string) { t.dirMode(name, 0o755) }

func (t *tarWriter) dirMode(name string, mode int64) {
	t.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}, nil)
}

func (t *tarWriter) file(name string, mode int64, body []byte) {
	t.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body))}, body)
}

func (t *tarWriter) symlink(name, target string) {
	t.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, nil)
}

// hardlink adds name as a hard link to target, a path in the layer.
func (t *tarWriter) hardlink(name, target string) {
	t.header(&tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o755}, nil)
}

func (t *tarWriter) close() error {
	if t.err != nil {
		return t.err
	}
	return t.tw.Close()
}

// lines joins ls, each ended by a newline.
func lines(ls []string) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l + "\n")
	}
	return b.String()
}
