package containerdtest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// TestToolsModuleMatchesRoot checks that tests/tools builds the containerd
// version the shim is built against (hack/build-tools.sh refuses otherwise).
func TestToolsModuleMatchesRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	version := func(path string) string {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.ParseLax(path, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range f.Require {
			if r.Mod.Path == "github.com/containerd/containerd/v2" {
				return r.Mod.Version
			}
		}
		t.Fatalf("%s does not require containerd/v2", path)
		return ""
	}
	want := version(filepath.Join(root, "go.mod"))
	got := version(filepath.Join(root, "tests", "tools", "go.mod"))
	if got != want {
		t.Errorf("tests/tools requires containerd %s, go.mod %s: run (cd tests/tools && go get github.com/containerd/containerd/v2@%s && go mod tidy)", got, want, want)
	}
}

// TestDaemonLifecycle starts a private containerd, checks it is isolated in
// its own directory with the extra config applied, and that Cleanup removes
// everything.
func TestDaemonLifecycle(t *testing.T) {
	var dir string
	t.Run("run", func(t *testing.T) {
		d := Start(t, Options{
			Namespace:   "lifecycle",
			PathPrefix:  []string{"/nonexistent-prefix"},
			ExtraConfig: "[plugins.'io.containerd.gc.v1.scheduler']\n  pause_threshold = 0.03\n",
		})
		dir = d.Dir
		out := d.Ctr(t, "version")
		if !strings.Contains(out, "Server:") {
			t.Errorf("ctr version: %s", out)
		}
		d.Ctr(t, "namespaces", "create", "extra")
		if out := d.Ctr(t, "namespaces", "ls", "--quiet"); !strings.Contains(out, "extra") {
			t.Errorf("namespace not created: %s", out)
		}
		if _, err := os.Stat(filepath.Join(d.Root, "io.containerd.metadata.v1.bolt", "meta.db")); err != nil {
			t.Errorf("metadata not under the private root: %v", err)
		}
		cfg, err := os.ReadFile(d.ConfigPath)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(cfg), "pause_threshold = 0.03") {
			t.Errorf("extra config missing from %s", cfg)
		}
		environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(d.cmd.Process.Pid), "environ"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(environ), "PATH=/nonexistent-prefix:"+d.ToolsBin+":") {
			t.Errorf("daemon PATH does not start with the prefix and tools dir")
		}
	})
	if dir == "" {
		return // skipped
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after cleanup (%v)", dir, err)
	}
}

// TestDaemonWithCRIAndExtraRuntime starts the daemon with the CRI plugins
// and a runtime registered through ExtraConfig, as the c8s e2e tests do.
func TestDaemonWithCRIAndExtraRuntime(t *testing.T) {
	d := Start(t, Options{
		CRI: true,
		ExtraConfig: "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s]\n" +
			"  runtime_type = \"io.containerd.c8s.v2\"\n",
	})
	plugins := d.Ctr(t, "plugins", "ls")
	for _, line := range strings.Split(plugins, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[0] == "io.containerd.grpc.v1" && f[1] == "cri" && f[3] != "ok" {
			t.Errorf("CRI plugin not ok: %s", line)
		}
	}
	if !strings.Contains(plugins, "io.containerd.grpc.v1") || !strings.Contains(plugins, " cri ") {
		t.Errorf("CRI plugin not listed:\n%s", plugins)
	}
	if !strings.Contains(d.Log(), "io.containerd.c8s.v2") {
		t.Errorf("the c8s runtime from ExtraConfig does not appear in the daemon's config dump")
	}
}
