// Package install puts c8s on a node and takes it off again: the binaries,
// the guest image (verified against its manifest first), the c8s configs
// (packaging.Configs: the default one and one per TEE handler; existing
// ones are kept), and the c8s runtime handlers in containerd's config.
//
// The handlers (those of packaging/containerd/c8s.toml, rewritten for the
// config's version 2 or 3) are registered
//   - as a drop-in, when containerd's main config imports a directory the
//     drop-in name matches (e.g. imports = ["/etc/containerd/conf.d/*.toml"]);
//   - otherwise by appending a marked block to the main config, after a
//     timestamped backup (config.toml.c8s-backup-YYYYMMDDTHHMMSSZ); the rest
//     of the file, comments and formatting included, is left byte for byte;
//   - when there is no main config at all, by creating one that imports
//     <dir>/conf.d/*.toml and writing the drop-in there.
//
// Handlers an administrator registered by hand are left alone. Install is
// idempotent: a second run reports every item "unchanged" and writes
// nothing. What install did is recorded in RecordPath; Uninstall uses the
// record to restore the original state: it restores the main config from
// the backup (when nothing else changed since) or removes exactly the
// block, removes the drop-in and the files install wrote, and keeps files
// the administrator changed since. containerd is restarted only when
// Options.Restart is set and its config changed.
package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/c8s-dev/c8s/launcher/admin/ctrdconfig"
	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/packaging"
)

// RecordPath is the host path of the install record.
const RecordPath = "/var/lib/c8s/install.json"

// Binaries are the host binaries install copies into <prefix>/bin.
var Binaries = []string{"containerd-shim-c8s-v2", "c8s-launcher", "c8s-verify", "c8s-measure"}

// Options say what to install where.
type Options struct {
	// Root is the filesystem root to install into ("/" for the live host,
	// or a staging directory such as DESTDIR).
	Root string
	// Prefix is the installation prefix (default /usr/local).
	Prefix string
	// SysconfDir holds c8s/config.toml (default /etc).
	SysconfDir string
	// BinDir holds the built binaries to install (Install only).
	BinDir string
	// ImageDir holds the built guest image and manifest.json (Install only).
	ImageDir string
	// ContainerdConfig is containerd's main config (default /etc/containerd/config.toml).
	ContainerdConfig string
	// ContainerdConfigVersion is the version of a main config install
	// creates when there is none: 3 for containerd 2.x (default), 2 for 1.x.
	ContainerdConfigVersion int
	// Restart restarts containerd (systemctl restart containerd) when its
	// config changed.
	Restart bool
	// Systemctl runs systemctl; nil runs the systemctl binary (chrooted
	// into Root when Root is not "/").
	Systemctl func(ctx context.Context, args ...string) error
	// Now is the clock used for backup names (default time.Now).
	Now func() time.Time
}

func (o *Options) setDefaults() {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Prefix == "" {
		o.Prefix = "/usr/local"
	}
	if o.SysconfDir == "" {
		o.SysconfDir = "/etc"
	}
	if o.ContainerdConfig == "" {
		o.ContainerdConfig = filepath.Join(o.SysconfDir, "containerd", "config.toml")
	}
	if o.ContainerdConfigVersion == 0 {
		o.ContainerdConfigVersion = 3
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Systemctl == nil {
		root := o.Root
		o.Systemctl = func(ctx context.Context, args ...string) error {
			cmd := exec.CommandContext(ctx, "systemctl", args...)
			if root != "/" {
				cmd = exec.CommandContext(ctx, "chroot", append([]string{root, "systemctl"}, args...)...)
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("systemctl %v: %v: %s", args, err, bytes.TrimSpace(out))
			}
			return nil
		}
	}
}

// Change is one thing install or uninstall did (or found already done).
type Change struct {
	// Action is one of created, updated, unchanged, kept, kept existing,
	// backed up, edited, restored, removed, restarted.
	Action string `json:"action"`
	Path   string `json:"path"`
	Note   string `json:"note,omitempty"`
}

func (c Change) String() string {
	if c.Note == "" {
		return fmt.Sprintf("%-13s %s", c.Action, c.Path)
	}
	return fmt.Sprintf("%-13s %s (%s)", c.Action, c.Path, c.Note)
}

// record is what install did, for uninstall.
type record struct {
	// Files install wrote, with the sha256 it wrote.
	Files []fileRecord `json:"files"`
	// Dirs install created, parents first.
	Dirs       []string          `json:"dirs,omitempty"`
	Containerd *containerdRecord `json:"containerd,omitempty"`
}

type fileRecord struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
}

type installer struct {
	o                 Options
	paths             packaging.Paths
	changes           []Change
	rec               *record
	containerdChanged bool
}

func newInstaller(o Options) *installer {
	o.setDefaults()
	return &installer{o: o, paths: packaging.Paths{SysconfDir: o.SysconfDir, DataDir: filepath.Join(o.Prefix, "share")}}
}

func (in *installer) path(p string) string { return ctrdconfig.RootJoin(in.o.Root, p) }

func (in *installer) report(action, path, note string) {
	in.changes = append(in.changes, Change{Action: action, Path: path, Note: note})
}

// mkdirAll creates host directory dir under the root, recording the
// directories it created.
func (in *installer) mkdirAll(dir string) error {
	var missing []string
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(in.path(d)); err == nil {
			break
		}
		missing = append(missing, d)
	}
	if err := os.MkdirAll(in.path(dir), 0o755); err != nil {
		return err
	}
	if in.rec != nil {
		for i := len(missing) - 1; i >= 0; i-- {
			if !slices.Contains(in.rec.Dirs, missing[i]) {
				in.rec.Dirs = append(in.rec.Dirs, missing[i])
			}
		}
	}
	return nil
}

// writeFile writes host file p atomically and reports action.
func (in *installer) writeFile(p string, data []byte, mode os.FileMode, action, note string) error {
	if err := in.mkdirAll(filepath.Dir(p)); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(in.path(filepath.Dir(p)), ".c8s-install-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), in.path(p)); err != nil {
		return err
	}
	in.report(action, p, note)
	return nil
}

// syncFile makes host file p hold data: created, updated or unchanged. It
// records the file for uninstall and returns whether it wrote.
func (in *installer) syncFile(p string, data []byte, mode os.FileMode, note string) (bool, error) {
	sum := sha256.Sum256(data)
	in.recordFile(p, hex.EncodeToString(sum[:]))
	old, err := os.ReadFile(in.path(p))
	switch {
	case err == nil && bytes.Equal(old, data):
		if st, err := os.Stat(in.path(p)); err == nil && st.Mode().Perm() != mode {
			return true, os.Chmod(in.path(p), mode)
		}
		in.report("unchanged", p, note)
		return false, nil
	case err == nil:
		return true, in.writeFile(p, data, mode, "updated", note)
	case errors.Is(err, os.ErrNotExist):
		return true, in.writeFile(p, data, mode, "created", note)
	default:
		return false, err
	}
}

func (in *installer) recordFile(p, sum string) {
	for i, f := range in.rec.Files {
		if f.Path == p {
			in.rec.Files[i].SHA256 = sum
			return
		}
	}
	in.rec.Files = append(in.rec.Files, fileRecord{Path: p, SHA256: sum})
}

func (in *installer) remove(p string) error {
	if err := os.Remove(in.path(p)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	in.report("removed", p, "")
	return nil
}

// removeIfOurs removes host file p if it starts with header.
func (in *installer) removeIfOurs(p string, header []byte) error {
	data, err := os.ReadFile(in.path(p))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(data, header) {
		in.report("kept", p, "not written by c8s-launcher install")
		return nil
	}
	return in.remove(p)
}

func (in *installer) loadRecord() (*record, error) {
	data, err := os.ReadFile(in.path(RecordPath))
	if errors.Is(err, os.ErrNotExist) {
		return &record{}, nil
	}
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("install record %s is corrupt (%v): remove it and reinstall", RecordPath, err)
	}
	return &r, nil
}

func (in *installer) saveRecord() error {
	if err := in.mkdirAll(filepath.Dir(RecordPath)); err != nil {
		return err
	}
	data, err := json.MarshalIndent(in.rec, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if old, err := os.ReadFile(in.path(RecordPath)); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return in.writeFile(RecordPath, data, 0o644, "recorded", "what install did, for uninstall")
}

func (in *installer) restart(ctx context.Context) error {
	if !in.containerdChanged {
		return nil
	}
	if !in.o.Restart {
		in.report("note", in.o.ContainerdConfig, "containerd applies the change when restarted: systemctl restart containerd, or pass --restart")
		return nil
	}
	if err := in.o.Systemctl(ctx, "restart", "containerd"); err != nil {
		return err
	}
	in.report("restarted", "containerd", "")
	return nil
}

// Install installs c8s (see the package doc) and returns what it did.
func Install(ctx context.Context, o Options) ([]Change, error) {
	in := newInstaller(o)
	o = in.o
	if o.BinDir == "" || o.ImageDir == "" {
		return nil, errors.New("install: the binary and image directories are required (build them with `make build image`)")
	}
	if _, err := manifest.Verify(o.ImageDir); err != nil {
		return nil, fmt.Errorf("install: %w", err)
	}
	rec, err := in.loadRecord()
	if err != nil {
		return nil, err
	}
	in.rec = rec
	copyIn := func(src, dst string, mode os.FileMode) error {
		data, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("install: %w (run `make build image` first)", err)
		}
		_, err = in.syncFile(dst, data, mode, "")
		return err
	}
	for _, b := range Binaries {
		if err := copyIn(filepath.Join(o.BinDir, b), filepath.Join(o.Prefix, "bin", b), 0o755); err != nil {
			return in.changes, err
		}
	}
	files, err := imageFiles(o.ImageDir)
	if err != nil {
		return in.changes, err
	}
	for _, f := range files {
		if err := copyIn(filepath.Join(o.ImageDir, f), filepath.Join(o.Prefix, "share", "c8s", f), 0o644); err != nil {
			return in.changes, err
		}
	}
	if err := in.installConfig(); err != nil {
		return in.changes, err
	}
	if err := in.installContainerd(rec); err != nil {
		return in.changes, fmt.Errorf("install: containerd config: %w", err)
	}
	if err := in.saveRecord(); err != nil {
		return in.changes, err
	}
	return in.changes, in.restart(ctx)
}

// installConfig writes the packaged c8s configs (the default one and one
// per TEE handler, packaging.Configs) where none exists yet.
func (in *installer) installConfig() error {
	for _, name := range packaging.Configs {
		if err := in.installConfigFile(name); err != nil {
			return err
		}
	}
	return nil
}

func (in *installer) installConfigFile(name string) error {
	p := filepath.Join(in.o.SysconfDir, name)
	content, err := packaging.Render(name, in.paths)
	if err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(content))
	old, err := os.ReadFile(in.path(p))
	switch {
	case err == nil && bytes.Equal(old, []byte(content)):
		in.report("unchanged", p, "")
		return nil
	case err == nil:
		in.report("kept existing", p, "")
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	in.recordFile(p, hex.EncodeToString(sum[:]))
	return in.writeFile(p, []byte(content), 0o644, "created", "")
}

// Uninstall undoes what Install recorded and returns what it did.
func Uninstall(ctx context.Context, o Options) ([]Change, error) {
	in := newInstaller(o)
	if _, err := os.Stat(in.path(RecordPath)); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("uninstall: no install record at %s: c8s-launcher install did not install here", RecordPath)
	}
	rec, err := in.loadRecord()
	if err != nil {
		return nil, err
	}
	if rec.Containerd != nil {
		if err := in.uninstallContainerd(rec.Containerd); err != nil {
			return in.changes, fmt.Errorf("uninstall: containerd config: %w", err)
		}
		in.containerdChanged = true
	}
	for _, f := range rec.Files {
		if rec.Containerd != nil && f.Path == rec.Containerd.DropIn {
			continue
		}
		data, err := os.ReadFile(in.path(f.Path))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return in.changes, err
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != f.SHA256 {
			in.report("kept", f.Path, "changed since install")
			continue
		}
		if err := in.remove(f.Path); err != nil {
			return in.changes, err
		}
	}
	if err := os.Remove(in.path(RecordPath)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return in.changes, err
	}
	// Directories install created, deepest first, if they are empty now.
	for i := len(rec.Dirs) - 1; i >= 0; i-- {
		_ = os.Remove(in.path(rec.Dirs[i]))
	}
	return in.changes, in.restart(ctx)
}

// WriteChanges prints one line per change.
func WriteChanges(w io.Writer, changes []Change) error {
	for _, c := range changes {
		if _, err := fmt.Fprintln(w, c.String()); err != nil {
			return err
		}
	}
	return nil
}

// DetectConfigVersion returns the containerd config version that suits the
// containerd binary in PATH (chrooted into root unless root is "/"): 2 for
// containerd 1.x, else 3.
func DetectConfigVersion(ctx context.Context, root string) int {
	cmd := exec.CommandContext(ctx, "containerd", "--version")
	if root != "" && root != "/" {
		cmd = exec.CommandContext(ctx, "chroot", root, "containerd", "--version")
	}
	out, err := cmd.Output()
	if err != nil {
		return 3
	}
	return configVersionFor(string(out))
}

// configVersionFor maps `containerd --version` output to a config version.
func configVersionFor(versionOutput string) int {
	for _, f := range strings.Fields(versionOutput) {
		if strings.HasPrefix(f, "v1.") || strings.HasPrefix(f, "1.") {
			return 2
		}
	}
	return 3
}

// imageFiles lists what to install from the image directory: every
// artefact its manifest names (kernel, initrds, the sealed root disk, UKI,
// IGVM), after checking each against its sha256, then the manifest.
func imageFiles(dir string) ([]string, error) {
	m, err := manifest.Verify(dir)
	if err != nil {
		return nil, fmt.Errorf("install: guest image in %s: %w (run `make image`)", dir, err)
	}
	var files []string
	for _, role := range slices.Sorted(maps.Keys(m.Artifacts)) {
		files = append(files, m.Artifacts[role].File)
	}
	return append(files, manifest.FileName), nil
}
