package packaging

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"

	goldenfile "github.com/c8s-dev/c8s/internal/golden"
	"github.com/c8s-dev/c8s/launcher/config"
)

var paths = Paths{SysconfDir: "/etc", DataDir: "/usr/local/share"}

// golden checks a rendered file against testdata/golden (go test
// ./packaging -update rewrites it).
func golden(t *testing.T, name, got string) {
	t.Helper()
	goldenfile.Check(t, strings.ReplaceAll(name, "/", "_"), []byte(got))
}

func TestContainerdDropInRegistersTheC8sHandler(t *testing.T) {
	out, err := Render("containerd/c8s.toml", paths)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "containerd/c8s.toml", out)
	var cfg struct {
		Version int `toml:"version"`
		Plugins map[string]struct {
			Containerd struct {
				Runtimes map[string]struct {
					RuntimeType string            `toml:"runtime_type"`
					Options     map[string]string `toml:"options"`
				} `toml:"runtimes"`
			} `toml:"containerd"`
		} `toml:"plugins"`
	}
	if err := toml.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatalf("drop-in is not valid TOML: %v", err)
	}
	if cfg.Version != 3 {
		t.Fatalf("version = %d, want 3 (containerd 2.x config)", cfg.Version)
	}
	rt, ok := cfg.Plugins["io.containerd.cri.v1.runtime"].Containerd.Runtimes["c8s"]
	if !ok {
		t.Fatal("no runtimes.c8s under the CRI runtime plugin")
	}
	if rt.RuntimeType != "io.containerd.c8s.v2" {
		t.Fatalf("runtime_type = %q", rt.RuntimeType)
	}
	if rt.Options["ConfigPath"] != "/etc/c8s/config.toml" {
		t.Fatalf("ConfigPath = %q", rt.Options["ConfigPath"])
	}
}

func TestDefaultConfigLoads(t *testing.T) {
	out, err := Render("c8s/config.toml", paths)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "c8s/config.toml", out)
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("packaged config does not load: %v", err)
	}
	if cfg.Hypervisor.Kernel != "/usr/local/share/c8s/vmlinuz" || cfg.Hypervisor.TEE != "sim" {
		t.Fatalf("unexpected config: %+v", cfg.Hypervisor)
	}
}
