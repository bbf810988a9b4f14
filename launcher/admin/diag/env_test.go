package diag

import (
	"bytes"
	"context"
	"testing"

	"github.com/pelletier/go-toml/v2"

	"github.com/c8s-dev/c8s/internal/golden"
)

// TestEnvOnFixtureHost collects the environment of the SNP fixture host
// (with a live fake containerd) and compares it with a golden file; the
// build's own version fields are blanked first.
func TestEnvOnFixtureHost(t *testing.T) {
	root := fixtureRoot(t, "snp-host")
	env := CollectEnv(context.Background(), Options{Root: root, Config: fixtureConfig(t, root)}, "/etc/c8s/config.toml")
	if env.C8s.GoVersion == "" || env.C8s.Version == "" {
		t.Fatalf("c8s build info missing: %+v", env.C8s)
	}
	env.C8s.Version, env.C8s.Revision, env.C8s.GoVersion = "VERSION", "REVISION", "GO"
	// The configuration's keys belong to launcher/config; check one value
	// and keep them out of the golden file.
	if tee := env.Config["hypervisor"].(map[string]any)["tee"]; tee != "snp" {
		t.Fatalf("config.hypervisor.tee = %v", tee)
	}
	env.Config = map[string]any{}
	c := env.Containerd
	if !c.Reachable || c.Version != "v2.2.0-fixture" || c.ConfigVersion != 3 || len(c.ConfigFiles) != 2 || len(c.C8sHandlers) != 2 || len(c.LoadedHandlers) != 3 {
		t.Errorf("containerd: %+v", c)
	}
	if !env.Image.Verified || env.Image.KernelRelease != "6.12.107+deb12-cloud-amd64" || env.Hypervisor.Version != "9.2.0" ||
		env.Host.KernelRelease != "6.11.0-snp-host" || env.C8s.ShimPath != "/usr/local/bin/containerd-shim-c8s-v2" {
		t.Errorf("env: %+v", env)
	}
	// The fixture's layer cache holds one 8 KiB layer; what it takes on
	// disk depends on the file system the tree is checked out on.
	if l := env.Layers; l.Dir != "/var/lib/c8s/layers" || l.Count != 1 || l.Bytes != 8192 || l.Allocated == 0 || l.Problem != "" {
		t.Errorf("layers: %+v", l)
	}
	env.Layers.Allocated = 0
	var js, tm bytes.Buffer
	if err := env.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if err := env.WriteTOML(&tm); err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "env-snp-host.json", js.Bytes())
	golden.Check(t, "env-snp-host.toml", tm.Bytes())
	var back map[string]any
	if err := toml.Unmarshal(tm.Bytes(), &back); err != nil {
		t.Fatalf("env TOML does not parse: %v", err)
	}
	if back["hypervisor"].(map[string]any)["version"] != "9.2.0" {
		t.Fatalf("hypervisor.version in TOML: %v", back["hypervisor"])
	}
}
