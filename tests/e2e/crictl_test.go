package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

// TestCrictlPodLifecycle drives containerd's CRI with the real crictl, as
// a node admin would: a host-network pod with `--runtime c8s-sim`, a container
// created, started, exec'd into (it sees the guest kernel), its logs read,
// then everything stopped and removed, leaving nothing behind. One VM.
func TestCrictlPodLifecycle(t *testing.T) {
	e := setupCRI(t)
	crictlBin := filepath.Join(e.d.ToolsBin, "crictl")
	if _, err := os.Stat(crictlBin); err != nil {
		containerdtest.SkipOrFail(t, "crictl not found in %s: run make tools", e.d.ToolsBin)
	}
	dir := t.TempDir()
	crictlConfig := writeJSON(t, dir, "crictl.yaml", map[string]any{
		"runtime-endpoint": "unix://" + e.d.Address,
		"image-endpoint":   "unix://" + e.d.Address,
		"timeout":          120,
	})
	logDir := filepath.Join(dir, "logs")
	podConfig := writeJSON(t, dir, "pod.json", map[string]any{
		"metadata":      map[string]any{"name": "crictl-web", "namespace": "default", "uid": "uid-crictl-web"},
		"log_directory": logDir,
		"linux": map[string]any{"security_context": map[string]any{
			"namespace_options": map[string]any{"network": 2}, // NODE: host network
		}},
	})
	ctrConfig := writeJSON(t, dir, "container.json", map[string]any{
		"metadata": map[string]any{"name": "app"},
		"image":    map[string]any{"image": image},
		"command":  []string{"sh", "-c", "echo hello from the pod VM; exec sleep 600"},
		"log_path": "app.log",
	})
	crictl := func(args ...string) string {
		t.Helper()
		c, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(c, crictlBin, append([]string{"--config", crictlConfig}, args...)...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("crictl %s: %v\nstdout: %s\nstderr: %s\ncontainerd log:\n%s",
				strings.Join(args, " "), err, stdout.String(), stderr.String(), e.d.Log())
		}
		return strings.TrimSpace(stdout.String())
	}

	pod := crictl("runp", "--runtime", "c8s-sim", podConfig)
	removed := false
	t.Cleanup(func() {
		if !removed {
			exec.Command(crictlBin, "--config", crictlConfig, "stopp", pod).Run()
			exec.Command(crictlBin, "--config", crictlConfig, "rmp", "--force", pod).Run()
		}
	})
	qemus := e.qemus(t)
	if len(qemus) != 1 {
		t.Fatalf("QEMU processes after crictl runp: %v, want 1", qemus)
	}
	if got := crictl("pods", "--id", pod, "--state", "ready", "--quiet"); got != pod {
		t.Fatalf("crictl pods --state ready = %q, want the pod %s", got, pod)
	}

	ctr := crictl("create", pod, ctrConfig, podConfig)
	crictl("start", ctr)
	if now := e.qemus(t); len(now) != 1 || now[0] != qemus[0] {
		t.Fatalf("QEMU processes with the container: %v, want just the pod's %v", now, qemus)
	}
	if got, want := crictl("exec", ctr, "uname", "-r"), kernelRelease(t, e.imageDir); got != want {
		t.Fatalf("crictl exec uname -r = %q, want the guest kernel %q", got, want)
	}
	if got := crictl("logs", ctr); got != "hello from the pod VM" {
		t.Fatalf("crictl logs = %q, want the container's output", got)
	}

	crictl("stop", "--timeout", "5", ctr)
	if got := crictl("ps", "--all", "--id", ctr, "--state", "exited", "--quiet"); got != ctr {
		t.Fatalf("crictl ps --state exited = %q, want the stopped container %s", got, ctr)
	}
	crictl("rm", ctr)
	crictl("stopp", pod)
	crictl("rmp", pod)
	removed = true
	if got := crictl("pods", "--quiet"); got != "" {
		t.Fatalf("crictl pods after rmp = %q, want none", got)
	}
	e.assertNothingLeft(t)
}

// writeJSON writes v as JSON (which is also YAML, for crictl's config) to
// dir/name and returns the path.
func writeJSON(t *testing.T, dir, name string, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
