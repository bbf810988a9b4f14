package install

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/internal/golden"
	"github.com/c8s-dev/c8s/launcher/admin/ctrdconfig"
	"github.com/c8s-dev/c8s/manifest"
)

var fixedNow = func() time.Time { return time.Date(2026, 11, 29, 19, 30, 0, 0, time.UTC) }

// sources writes fake built binaries and a guest image with a valid
// manifest, as `make build image` would leave them.
func sources(t *testing.T) (binDir, imageDir string) {
	t.Helper()
	dir := t.TempDir()
	binDir, imageDir = filepath.Join(dir, "bin"), filepath.Join(dir, "image")
	for _, d := range []string{binDir, imageDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range Binaries {
		if err := os.WriteFile(filepath.Join(binDir, b), []byte("#!/bin/sh\necho "+b+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m := manifest.Manifest{Schema: manifest.Schema, Artifacts: map[string]manifest.Artifact{}, Kernel: manifest.Kernel{Release: "6.12-test"}}
	for role, f := range map[string]string{manifest.RoleKernel: "vmlinuz", manifest.RoleInitrd: "initrd.img"} {
		p := filepath.Join(imageDir, f)
		if err := os.WriteFile(p, []byte("fake "+role), 0o644); err != nil {
			t.Fatal(err)
		}
		a, err := manifest.Describe(p)
		if err != nil {
			t.Fatal(err)
		}
		m.Artifacts[role] = a
	}
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(imageDir, manifest.FileName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return binDir, imageDir
}

// stagedRoot returns a staging root holding the sample containerd config
// testdata/containerd/<sample>/config.toml, its path and its content.
func stagedRoot(t *testing.T, sample string) (root, mainPath string, content []byte) {
	t.Helper()
	root = t.TempDir()
	mainPath = filepath.Join(root, "etc/containerd/config.toml")
	content, err := os.ReadFile(filepath.Join("testdata/containerd", sample, "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(mainPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mainPath, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return root, mainPath, content
}

// snapshot maps every path under root to its mode and content.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	snap := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			snap[rel] = "dir " + info.Mode().String()
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		snap[rel] = info.Mode().String() + "\n" + string(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func diffSnapshots(a, b map[string]string) []string {
	var diffs []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			diffs = append(diffs, "gone: "+k)
		} else if v != w {
			diffs = append(diffs, "changed: "+k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, "new: "+k)
		}
	}
	sort.Strings(diffs)
	return diffs
}

func changesText(changes []Change) string {
	var b strings.Builder
	_ = WriteChanges(&b, changes)
	return b.String()
}

// TestInstallIntoContainerdConfigs installs into staging roots holding each
// sample containerd config, compares the resulting containerd files and the
// change list with golden files, checks that the handlers are registered
// as containerd would load them, that a second install changes nothing,
// and that uninstall restores the root byte for byte.
func TestInstallIntoContainerdConfigs(t *testing.T) {
	binDir, imageDir := sources(t)
	cases := []struct {
		name, wantMode string
		wantHandler    string // file that must define the c8s handler
	}{
		{"v3-imports", "drop-in", "/etc/containerd/conf.d/c8s.toml"},
		{"v3-no-imports", "edit", "/etc/containerd/config.toml"},
		{"v2-imports", "drop-in", "/etc/containerd/conf.d/c8s.toml"},
		{"v2-no-imports", "edit", "/etc/containerd/config.toml"},
		{"no-config", "created", "/etc/containerd/conf.d/c8s.toml"},
		{"v3-handwritten", "", "/etc/containerd/config.toml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			sample, err := os.ReadFile(filepath.Join("testdata", "containerd", tc.name, "config.toml"))
			if err == nil {
				if err := os.MkdirAll(filepath.Join(root, "etc/containerd/conf.d"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, "etc/containerd/config.toml"), sample, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			before := snapshot(t, root)
			var restarts int
			opts := Options{Root: root, BinDir: binDir, ImageDir: imageDir, Now: fixedNow, Restart: true,
				Systemctl: func(_ context.Context, args ...string) error {
					if strings.Join(args, " ") != "restart containerd" {
						t.Errorf("systemctl %v", args)
					}
					restarts++
					return nil
				}}
			changes, err := Install(context.Background(), opts)
			if err != nil {
				t.Fatalf("install: %v\n%s", err, changesText(changes))
			}
			golden.Check(t, tc.name+"/changes.txt", []byte(changesText(changes)))
			for _, f := range []string{"etc/containerd/config.toml", "etc/containerd/conf.d/c8s.toml"} {
				if data, err := os.ReadFile(filepath.Join(root, f)); err == nil {
					golden.Check(t, tc.name+"/"+strings.ReplaceAll(f, "/", "_"), data)
				}
			}
			cfg, err := ctrdconfig.Load(root, "/etc/containerd/config.toml")
			if err != nil {
				t.Fatal(err)
			}
			if h := cfg.Handlers["c8s"]; h.RuntimeType != ctrdconfig.RuntimeType || h.File != tc.wantHandler {
				t.Fatalf("containerd would load handler c8s %+v, want it from %s", h, tc.wantHandler)
			}
			if tc.name == "v3-no-imports" || tc.name == "v2-no-imports" {
				edited, _ := os.ReadFile(filepath.Join(root, "etc/containerd/config.toml"))
				if !bytes.HasPrefix(edited, bytes.TrimRight(sample, "\n")) {
					t.Fatalf("the edit changed the existing content:\n%s", edited)
				}
				backup, err := os.ReadFile(filepath.Join(root, "etc/containerd/config.toml.c8s-backup-20261129T193000Z"))
				if err != nil || !bytes.Equal(backup, sample) {
					t.Fatalf("backup: %v, equal to the original: %v", err, bytes.Equal(backup, sample))
				}
			}
			rec, err := newInstaller(opts).loadRecord()
			if err != nil {
				t.Fatal(err)
			}
			if mode := ""; rec.Containerd != nil {
				mode = rec.Containerd.Mode
				if mode != tc.wantMode {
					t.Fatalf("mode %q, want %q", mode, tc.wantMode)
				}
			} else if tc.wantMode != "" {
				t.Fatalf("no containerd record, want mode %q", tc.wantMode)
			}
			wantRestarts := 1
			if tc.wantMode == "" {
				wantRestarts = 0
			}
			if restarts != wantRestarts {
				t.Fatalf("containerd restarted %d times, want %d", restarts, wantRestarts)
			}

			// A second run changes nothing.
			installed := snapshot(t, root)
			changes, err = Install(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range changes {
				if c.Action != "unchanged" && c.Action != "kept" {
					t.Errorf("second install: %s", c)
				}
			}
			if d := diffSnapshots(installed, snapshot(t, root)); len(d) > 0 {
				t.Fatalf("second install changed files: %v", d)
			}
			if restarts != wantRestarts {
				t.Fatal("second install restarted containerd")
			}

			// Uninstall restores the original state.
			changes, err = Uninstall(context.Background(), opts)
			if err != nil {
				t.Fatalf("uninstall: %v\n%s", err, changesText(changes))
			}
			golden.Check(t, tc.name+"/uninstall.txt", []byte(changesText(changes)))
			if d := diffSnapshots(before, snapshot(t, root)); len(d) > 0 {
				t.Fatalf("uninstall did not restore the root: %v", d)
			}
		})
	}
}

// TestUninstallKeepsLaterEdits edits the containerd config and the c8s
// config after install: uninstall removes exactly the c8s block, keeps
// the admin's changes and the backup, and keeps the edited c8s config.
func TestUninstallKeepsLaterEdits(t *testing.T) {
	binDir, imageDir := sources(t)
	root, mainPath, sample := stagedRoot(t, "v3-no-imports")
	opts := Options{Root: root, BinDir: binDir, ImageDir: imageDir, Now: fixedNow}
	changes, err := Install(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(changesText(changes), "containerd applies the change when restarted") {
		t.Fatalf("install without --restart does not say containerd needs a restart:\n%s", changesText(changes))
	}
	edited, _ := os.ReadFile(mainPath)
	edited = append(edited, []byte("\n[debug]\n  level = \"debug\"\n")...)
	if err := os.WriteFile(mainPath, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	c8sConfig := filepath.Join(root, "etc/c8s/config.toml")
	if err := os.WriteFile(c8sConfig, []byte("# mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	changes, err = Uninstall(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(mainPath)
	if want := string(sample) + "\n[debug]\n  level = \"debug\"\n"; string(got) != want {
		t.Fatalf("after uninstall:\n%s\nwant:\n%s", got, want)
	}
	if _, err := os.Stat(mainPath + ".c8s-backup-20261129T193000Z"); err != nil {
		t.Fatalf("backup removed although the config could not be restored from it: %v", err)
	}
	if data, _ := os.ReadFile(c8sConfig); string(data) != "# mine\n" {
		t.Fatalf("uninstall touched the edited c8s config: %q", data)
	}
	for _, want := range []string{"kept          /etc/c8s/config.toml (changed since install)", "removed       /usr/local/bin/c8s-launcher"} {
		if !strings.Contains(changesText(changes), want) {
			t.Errorf("uninstall output lacks %q:\n%s", want, changesText(changes))
		}
	}
}

// TestInstallRefusesBadInput covers a tampered image, an old config
// version and uninstall without a record.
func TestInstallRefusesBadInput(t *testing.T) {
	binDir, imageDir := sources(t)
	root := t.TempDir()
	if _, err := Uninstall(context.Background(), Options{Root: root}); err == nil || !strings.Contains(err.Error(), "no install record") {
		t.Fatalf("uninstall without record: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/containerd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/containerd/config.toml"), []byte("[plugins.cri]\n  sandbox_image = \"pause\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Install(context.Background(), Options{Root: root, BinDir: binDir, ImageDir: imageDir})
	if err == nil || !strings.Contains(err.Error(), "containerd config migrate") {
		t.Fatalf("install into a version 1 config: %v", err)
	}
	if err := os.WriteFile(filepath.Join(imageDir, "vmlinuz"), []byte("tampered"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Install(context.Background(), Options{Root: t.TempDir(), BinDir: binDir, ImageDir: imageDir})
	if err == nil || !strings.Contains(err.Error(), "does not match its manifest") {
		t.Fatalf("install of a tampered image: %v", err)
	}
}

func TestSplitBlockRoundTrip(t *testing.T) {
	for _, orig := range []string{"", "version = 3\n", "version = 3", "version = 3\n\n\n"} {
		block := blockBegin + "[x]\n" + blockEnd
		rest, got, err := splitBlock(appendBlock([]byte(orig), block))
		if err != nil || got != block {
			t.Fatalf("%q: block %q, %v", orig, got, err)
		}
		want := orig
		if orig == "version = 3" {
			want = orig + "\n" // appendBlock ended the last line
		}
		if string(rest) != want {
			t.Errorf("%q: rest %q", orig, rest)
		}
	}
	if _, _, err := splitBlock([]byte(blockBegin + "[x]\n")); err == nil {
		t.Fatal("a block without END marker was accepted")
	}
}

func TestConfigVersionFor(t *testing.T) {
	for out, want := range map[string]int{
		"containerd github.com/containerd/containerd v1.7.24 88bf19b2105c8b17560993bee28a01ddc2f97182\n": 2,
		"containerd github.com/containerd/containerd/v2 2.2.0+unknown \n":                                3,
		"containerd containerd.io 1.6.33 d2d58213f83a351ca8f528a95fbd145f5654e957\n":                     2,
		"": 3,
	} {
		if got := configVersionFor(out); got != want {
			t.Errorf("%q: version %d, want %d", out, got, want)
		}
	}
}

// TestUpgradeReplacesTheBlock: when the packaged handlers change, install
// replaces its block after another backup, and uninstall still restores
// the file as it was before the first install.
func TestUpgradeReplacesTheBlock(t *testing.T) {
	binDir, imageDir := sources(t)
	root, mainPath, sample := stagedRoot(t, "v2-no-imports")
	opts := Options{Root: root, BinDir: binDir, ImageDir: imageDir, Now: fixedNow}
	if _, err := Install(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	// An older release wrote a different block.
	data, _ := os.ReadFile(mainPath)
	old := strings.Replace(string(data), "privileged_without_host_devices = true", "privileged_without_host_devices = false", 1)
	if err := os.WriteFile(mainPath, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	changes, err := Install(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	text := changesText(changes)
	if !strings.Contains(text, "backed up     /etc/containerd/config.toml.c8s-backup-20261129T193000Z-1") || !strings.Contains(text, "edited        /etc/containerd/config.toml") {
		t.Fatalf("upgrade:\n%s", text)
	}
	if now, _ := os.ReadFile(mainPath); !bytes.Equal(now, data) {
		t.Fatalf("upgraded config differs from a fresh install's:\n%s", now)
	}
	if _, err := Uninstall(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(mainPath); !bytes.Equal(got, sample) {
		t.Fatalf("uninstall after an upgrade:\n%s", got)
	}
	entries, _ := os.ReadDir(filepath.Dir(mainPath))
	if len(entries) != 1 {
		t.Fatalf("left in /etc/containerd: %v", entries)
	}
}
