package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/packaging"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

// TestContainerdImportsTheDropIn has the real containerd read a config that
// imports the packaged drop-in, and checks that the CRI plugin ends up with
// the c8s handler.
func TestContainerdImportsTheDropIn(t *testing.T) {
	bin := containerdtest.ToolsBin(t)
	dir := t.TempDir()
	dropIn, err := packaging.Render("containerd/c8s.toml", packaging.Paths{SysconfDir: "/etc", DataDir: "/usr/local/share"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "conf.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "conf.d", "c8s.toml"), []byte(dropIn), 0o644); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(main, []byte("version = 3\nimports = [\""+dir+"/conf.d/*.toml\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(bin, "containerd"), "--config", main, "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd config dump: %v\n%s", err, out)
	}
	dump := string(out)
	i := strings.Index(dump, "runtimes.c8s]")
	if i < 0 {
		t.Fatalf("containerd's merged config has no runtimes.c8s:\n%s", dump)
	}
	section := dump[i:]
	if j := strings.Index(section[1:], "\n  [plugins"); j > 0 {
		section = section[:j+1]
	}
	for _, want := range []string{"runtime_type = 'io.containerd.c8s.v2'", "ConfigPath = '/etc/c8s/config.toml'"} {
		if !strings.Contains(section, want) {
			t.Errorf("runtimes.c8s lacks %s:\n%s", want, section)
		}
	}
}

// TestInstallPutsEverythingInPlace runs `make install`'s script into a
// staging root and checks what lands where; a second run keeps the config.
func TestInstallPutsEverythingInPlace(t *testing.T) {
	root, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "_output", "image", "vmlinuz")); err != nil {
		containerdtest.SkipOrFail(t, "no guest image: run make image")
	}
	dest := t.TempDir()
	install := func() string {
		cmd := exec.Command(filepath.Join(root, "hack", "install.sh"), "/usr/local")
		cmd.Env = append(os.Environ(), "DESTDIR="+dest)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh: %v\n%s", err, out)
		}
		return string(out)
	}
	install()
	for _, f := range []string{
		"usr/local/bin/containerd-shim-c8s-v2", "usr/local/bin/c8s-launcher", "usr/local/bin/c8s-verify", "usr/local/bin/c8s-measure",
		"usr/local/share/c8s/vmlinuz", "usr/local/share/c8s/initrd.img", "usr/local/share/c8s/rootfs.img", "usr/local/share/c8s/c8s.efi", "usr/local/share/c8s/manifest.json",
		"etc/c8s/config.toml", "etc/containerd/conf.d/c8s.toml",
	} {
		if _, err := os.Stat(filepath.Join(dest, f)); err != nil {
			t.Errorf("not installed: %s", f)
		}
	}
	cfg, err := os.ReadFile(filepath.Join(dest, "etc/c8s/config.toml"))
	if err != nil || !strings.Contains(string(cfg), `kernel = "/usr/local/share/c8s/vmlinuz"`) {
		t.Fatalf("installed config does not point at the installed kernel:\n%s", cfg)
	}
	if err := os.WriteFile(filepath.Join(dest, "etc/c8s/config.toml"), []byte("# edited by the admin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := install(); !strings.Contains(out, "kept existing") {
		t.Fatalf("second install did not keep the admin's config:\n%s", out)
	}
	if cfg, _ := os.ReadFile(filepath.Join(dest, "etc/c8s/config.toml")); string(cfg) != "# edited by the admin\n" {
		t.Fatalf("second install overwrote the config: %q", cfg)
	}
}
