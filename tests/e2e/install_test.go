package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/admin/diag"
	"github.com/c8s-dev/c8s/launcher/admin/install"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

// TestInstalledHandlerLoadsInContainerd installs into staging roots holding
// the sample containerd configs of launcher/admin/install (version 2 and 3, edited
// in place or given a drop-in) and has the real containerd load the result:
// the c8s handler is there with its options, the sample's own runc settings
// survive, and after uninstall the handler is gone again.
func TestInstalledHandlerLoadsInContainerd(t *testing.T) {
	bin := containerdtest.ToolsBin(t)
	repo, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	imageDir := filepath.Join(repo, "_output", "image")
	if _, err := os.Stat(filepath.Join(imageDir, "manifest.json")); err != nil {
		containerdtest.SkipOrFail(t, "no guest image: run make image")
	}
	binDir := t.TempDir()
	for _, b := range install.Binaries {
		if err := os.WriteFile(filepath.Join(binDir, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dump := func(root string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(bin, "containerd"), "--config", filepath.Join(root, "etc/containerd/config.toml"), "config", "dump").CombinedOutput()
		if err != nil {
			t.Fatalf("containerd config dump: %v\n%s", err, out)
		}
		return string(out)
	}
	// Samples whose imports are relative, so that containerd finds the
	// drop-in inside the staging root.
	for _, sample := range []string{"v3-no-imports", "v2-no-imports", "v2-imports"} {
		t.Run(sample, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(repo, "launcher/admin/install/testdata/containerd", sample, "config.toml"))
			if err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "etc/containerd/conf.d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "etc/containerd/config.toml"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			before := dump(root)
			opts := install.Options{Root: root, BinDir: binDir, ImageDir: imageDir}
			if _, err := install.Install(context.Background(), opts); err != nil {
				t.Fatal(err)
			}
			after := dump(root)
			i := strings.Index(after, "runtimes.c8s]")
			if i < 0 {
				t.Fatalf("containerd's merged config has no runtimes.c8s:\n%s", after)
			}
			section := after[i:]
			if j := strings.Index(section, "runtimes.runc]"); j > 0 {
				section = section[:j]
			}
			for _, want := range []string{"runtime_type = 'io.containerd.c8s.v2'", "ConfigPath = '/etc/c8s/config.toml'", "privileged_without_host_devices = true"} {
				if !strings.Contains(section, want) {
					t.Errorf("runtimes.c8s lacks %s:\n%s", want, section)
				}
			}
			for _, kept := range []string{"SystemdCgroup = true", "pause:3.10"} {
				if strings.Contains(before, kept) && !strings.Contains(after, kept) {
					t.Errorf("the install lost %q from the sample's settings", kept)
				}
			}
			if _, err := install.Uninstall(context.Background(), opts); err != nil {
				t.Fatal(err)
			}
			if again := dump(root); again != before {
				t.Fatalf("after uninstall containerd loads a different config:\n%s", again)
			}
		})
	}
}

// TestCheckSeesWhatContainerdLoaded runs c8s-launcher check's containerd
// checks against real containerd daemons with CRI: a handler added to the
// config of a running daemon is reported as not loaded (restart needed),
// and a daemon started with the handler reports it loaded.
func TestCheckSeesWhatContainerdLoaded(t *testing.T) {
	handler := "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s]\n  runtime_type = 'io.containerd.c8s.v2'\n"
	check := func(d *containerdtest.Daemon) map[string]diag.Result {
		t.Helper()
		rep := diag.Run(context.Background(), diag.Options{Config: config.Default(), ContainerdAddress: d.Address, ContainerdConfig: d.ConfigPath})
		byID := map[string]diag.Result{}
		for _, r := range rep.Checks {
			byID[r.ID] = r
		}
		if r := byID["containerd.socket"]; r.Status != diag.Pass || !strings.Contains(r.Detail, "containerd ") {
			t.Fatalf("containerd.socket: %+v", r)
		}
		return byID
	}

	stale := containerdtest.Start(t, containerdtest.Options{CRI: true})
	f, err := os.OpenFile(stale.ConfigPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("\n" + handler); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if r := check(stale)["containerd.handler"]; r.Status != diag.Fail || !strings.Contains(r.Detail, "has not loaded c8s") || !strings.Contains(r.Hint, "restart containerd") {
		t.Fatalf("handler added without a restart: %+v", r)
	}

	fresh := containerdtest.Start(t, containerdtest.Options{CRI: true, ExtraConfig: handler})
	r := check(fresh)["containerd.handler"]
	if !strings.Contains(r.Detail, "loaded by containerd") || !strings.Contains(r.Facts["loaded"], "c8s") {
		t.Fatalf("handler of a freshly started daemon: %+v", r)
	}
}
