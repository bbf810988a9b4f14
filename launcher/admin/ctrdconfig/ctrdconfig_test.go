package ctrdconfig

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func write(t *testing.T, root, p, content string) {
	t.Helper()
	full := RootJoin(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadFollowsImportsLikeContainerd(t *testing.T) {
	root := t.TempDir()
	write(t, root, "/etc/containerd/config.toml", `version = 3
imports = ["conf.d/*.toml", "/opt/extra.toml"]
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
`)
	write(t, root, "/etc/containerd/conf.d/c8s.toml", `version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s]
  runtime_type = 'io.containerd.c8s.v2'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s.options]
    ConfigPath = '/etc/c8s/config.toml'
`)
	write(t, root, "/etc/containerd/conf.d/ignored.conf", "not toml [")
	write(t, root, "/opt/extra.toml", `version = 3
imports = ["/etc/containerd/config.toml"]
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s-snp]
  runtime_type = 'io.containerd.c8s.v2'
`)
	cfg, err := Load(root, "")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Exists || cfg.Version != 3 || len(cfg.Files) != 3 {
		t.Fatalf("exists %v version %d files %d", cfg.Exists, cfg.Version, len(cfg.Files))
	}
	if got := cfg.C8sHandlers(); !reflect.DeepEqual(got, []string{"c8s", "c8s-snp"}) {
		t.Fatalf("c8s handlers %v", got)
	}
	if h := cfg.Handlers["c8s"]; h.File != "/etc/containerd/conf.d/c8s.toml" || h.ConfigPath != "/etc/c8s/config.toml" {
		t.Fatalf("c8s handler %+v", h)
	}
}

func TestVersions(t *testing.T) {
	for version, plugin := range map[int]string{2: `"io.containerd.grpc.v1.cri"`, 3: `'io.containerd.cri.v1.runtime'`} {
		f, err := Parse("/c.toml", []byte("version = "+string(rune('0'+version))+"\n[plugins."+plugin+".containerd.runtimes.c8s]\nruntime_type = \"io.containerd.c8s.v2\"\n"))
		if err != nil {
			t.Fatal(err)
		}
		if f.Handlers["c8s"].RuntimeType != RuntimeType {
			t.Errorf("version %d: handlers %v", version, f.Handlers)
		}
	}
	// A v3 table in a v2 file is not where containerd 1.x looks.
	f, err := Parse("/c.toml", []byte("version = 2\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s]\nruntime_type = \"io.containerd.c8s.v2\"\n"))
	if err != nil || len(f.Handlers) != 0 {
		t.Fatalf("v2 file with a v3 table: %v %v", f, err)
	}
	if _, err := Parse("/c.toml", []byte("version = 9\n")); err == nil {
		t.Fatal("version 9 accepted")
	}
	if _, err := Parse("/c.toml", []byte("version = \n")); err == nil {
		t.Fatal("invalid TOML accepted")
	}
	cfg, err := Load(t.TempDir(), "/etc/containerd/config.toml")
	if err != nil || cfg.Exists {
		t.Fatalf("missing main config: %+v %v", cfg, err)
	}
}

// CRI's discard_unpacked_layers, where each config version keeps it; a
// later file overrides an earlier one, as for handlers.
func TestDiscardUnpackedLayers(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want *bool
	}{
		{"version = 3\n", nil},
		{"version = 3\n[plugins.'io.containerd.cri.v1.images']\ndiscard_unpacked_layers = true\n", ptr(true)},
		{"version = 3\n[plugins.'io.containerd.cri.v1.images']\ndiscard_unpacked_layers = false\n", ptr(false)},
		{"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndiscard_unpacked_layers = true\n", ptr(true)},
		// Not where a version 3 config keeps it.
		{"version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\ndiscard_unpacked_layers = true\n", nil},
	} {
		f, err := Parse("/c.toml", []byte(tc.doc))
		if err != nil {
			t.Fatal(err)
		}
		if (f.DiscardUnpackedLayers == nil) != (tc.want == nil) || (tc.want != nil && *f.DiscardUnpackedLayers != *tc.want) {
			t.Errorf("%q: DiscardUnpackedLayers %v, want %v", tc.doc, f.DiscardUnpackedLayers, tc.want)
		}
	}
	root := t.TempDir()
	write(t, root, "/etc/containerd/config.toml", "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n[plugins.'io.containerd.cri.v1.images']\ndiscard_unpacked_layers = true\n")
	write(t, root, "/etc/containerd/conf.d/keep.toml", "version = 3\n[plugins.'io.containerd.cri.v1.images']\ndiscard_unpacked_layers = false\n")
	cfg, err := Load(root, "")
	if err != nil || cfg.DiscardUnpackedLayers || cfg.DiscardFile != "/etc/containerd/conf.d/keep.toml" {
		t.Fatalf("merged: %v from %s, %v", cfg.DiscardUnpackedLayers, cfg.DiscardFile, err)
	}
}

func ptr[T any](v T) *T { return &v }
