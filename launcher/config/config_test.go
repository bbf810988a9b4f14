package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kata-containers/kata-containers/src/runtime/virtcontainers/pkg/annotations"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// validConfig returns a config whose files exist.
func validConfig(t *testing.T) *Config {
	t.Helper()
	dir := t.TempDir()
	c := Default()
	c.Hypervisor.Path = writeFile(t, dir, "qemu", "")
	c.Hypervisor.Kernel = writeFile(t, dir, "vmlinuz", "k")
	c.Hypervisor.Initrd = writeFile(t, dir, "initrd", "i")
	return &c
}

func TestDefaults(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	h := c.Hypervisor
	if h.Path != "/usr/bin/qemu-system-x86_64" || h.DefaultVCPUs != 1 || h.DefaultMemoryMiB != 512 ||
		h.Accel != "auto" || h.TEE != "sim" || c.Runtime.StateDir != "/run/c8s" ||
		h.SNP.CBitPos != 51 || h.SNP.ReducedPhysBits != 1 || h.SNP.Policy != 0x30000 {
		t.Fatalf("defaults = %+v", c)
	}
	if got := c.CachePath(); got != "/run/c8s/cache" {
		t.Fatalf("CachePath = %q", got)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "c8s.toml", `
[hypervisor]
path = "qemu-system-x86_64"
kernel = "/k"
initrd = "/i"
kernel_params = "c8s.debug=1"
default_vcpus = 4
default_memory = 2048
accel = "tcg"
tee = "snp"
enable_annotations = ["default_vcpus"]

[hypervisor.snp]
policy = 0x30001
host_data = "00"

[hypervisor.tdx]
quote_generation_socket = "vsock:4050"

[runtime]
state_dir = "/tmp/c8s"
debug = true
`)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Hypervisor.Path = "qemu-system-x86_64"
	want.Hypervisor.Kernel, want.Hypervisor.Initrd = "/k", "/i"
	want.Hypervisor.KernelParams = "c8s.debug=1"
	want.Hypervisor.DefaultVCPUs, want.Hypervisor.DefaultMemoryMiB = 4, 2048
	want.Hypervisor.Accel, want.Hypervisor.TEE = "tcg", "snp"
	want.Hypervisor.EnableAnnotations = []string{"default_vcpus"}
	want.Hypervisor.SNP.Policy, want.Hypervisor.SNP.HostData = 0x30001, "00"
	want.Hypervisor.TDX.QuoteGenerationSocket = "vsock:4050"
	want.Runtime = Runtime{StateDir: "/tmp/c8s", Debug: true, Rootfs: RootfsLayers}
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("Load =\n%+v\nwant\n%+v", *c, want)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, content string
		want          []string
	}{
		{"unknown-key", "[hypervisor]\nkernel = \"/k\"\n\nkernal_params = \"x\"\n", []string{"line 4", `"hypervisor.kernal_params"`, "unknown key"}},
		{"unknown-table", "[hypervisor]\n[hypervisor.sev]\ncbitpos = 1\n", []string{"line 2", `"hypervisor.sev"`}},
		{"wrong-type", "[hypervisor]\ndefault_vcpus = \"two\"\n", []string{"line 2", "default_vcpus"}},
		{"syntax", "[hypervisor\n", []string{"line 1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeFile(t, dir, c.name+".toml", c.content)
			_, err := Load(p)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, w := range append(c.want, p) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	missing := filepath.Join(dir, "nope.toml")
	if _, err := Load(missing); err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Load of a missing file: %v", err)
	}
}

func TestValidate(t *testing.T) {
	if err := validConfig(t).Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"unknown-tee", func(c *Config) { c.Hypervisor.TEE = "sgx" }, []string{`"sgx"`, "sim, snp, tdx"}},
		{"unknown-accel", func(c *Config) { c.Hypervisor.Accel = "hvf" }, []string{`"hvf"`, "auto, kvm, tcg"}},
		{"missing-kernel", func(c *Config) { c.Hypervisor.Kernel = "/nonexistent/vmlinuz" }, []string{"/nonexistent/vmlinuz", "make image", "hypervisor.kernel"}},
		{"unset-initrd", func(c *Config) { c.Hypervisor.Initrd = "" }, []string{"hypervisor.initrd is not set", "make image"}},
		{"kernel-is-dir", func(c *Config) { c.Hypervisor.Kernel = t.TempDir() }, []string{"is a directory"}},
		{"snp-without-firmware", func(c *Config) { c.Hypervisor.TEE = "snp" }, []string{"hypervisor.firmware is not set"}},
		{"zero-vcpus", func(c *Config) { c.Hypervisor.DefaultVCPUs = 0 }, []string{"default_vcpus 0"}},
		{"tiny-memory", func(c *Config) { c.Hypervisor.DefaultMemoryMiB = 8 }, []string{"default_memory 8"}},
		{"unknown-annotation", func(c *Config) { c.Hypervisor.EnableAnnotations = []string{"default_vcpu"} }, []string{`"default_vcpu"`, "default_memory, default_vcpus, kernel_params"}},
		{"qemu-not-in-path", func(c *Config) { c.Hypervisor.Path = "no-such-qemu" }, []string{`"no-such-qemu"`, "PATH"}},
		{"relative-state-dir", func(c *Config) { c.Runtime.StateDir = "run" }, []string{"runtime.state_dir"}},
		{"long-state-dir", func(c *Config) { c.Runtime.StateDir = "/" + strings.Repeat("s", statedir.MaxRoot) }, []string{"runtime.state_dir", "41 bytes", "longer than the 40", "unix sockets", "107 bytes", "use a shorter directory such as /run/c8s"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := validConfig(t)
			c.mutate(cfg)
			err := cfg.Validate()
			if err == nil {
				t.Fatal("Validate succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestWithAnnotations(t *testing.T) {
	base := Default()
	base.Hypervisor.KernelParams = "a=1"
	ann := map[string]string{
		annotations.DefaultVCPUs:  "3",
		annotations.DefaultMemory: "1024",
		annotations.KernelParams:  "b=2",
		annotations.KernelPath:    "/evil/vmlinuz", // never honoured
		"io.example/unrelated":    "x",
	}

	t.Run("nothing-allowlisted", func(t *testing.T) {
		got, err := base.WithAnnotations(ann)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, base) {
			t.Fatalf("annotations applied without allowlist: %+v", got.Hypervisor)
		}
	})

	t.Run("partly-allowlisted", func(t *testing.T) {
		c := base
		c.Hypervisor.EnableAnnotations = []string{"default_memory", "kernel_params"}
		got, err := c.WithAnnotations(ann)
		if err != nil {
			t.Fatal(err)
		}
		h := got.Hypervisor
		if h.DefaultVCPUs != 1 || h.DefaultMemoryMiB != 1024 || h.KernelParams != "a=1 b=2" || h.Kernel != "" {
			t.Fatalf("got %+v", h)
		}
		if c.Hypervisor.KernelParams != "a=1" || c.Hypervisor.DefaultMemoryMiB != 512 {
			t.Fatal("WithAnnotations modified its receiver")
		}
	})

	t.Run("invalid-values", func(t *testing.T) {
		c := base
		c.Hypervisor.EnableAnnotations = []string{"default_vcpus", "default_memory", "kernel_params"}
		for key, value := range map[string]string{
			annotations.DefaultVCPUs:  "0",
			annotations.DefaultMemory: "lots",
			annotations.KernelParams:  "a\nb",
		} {
			_, err := c.WithAnnotations(map[string]string{key: value})
			if err == nil || !strings.Contains(err.Error(), key) {
				t.Errorf("%s=%q: err = %v, want one naming the annotation", key, value, err)
			}
		}
		// Invalid values of annotations that are not allowlisted are ignored.
		c.Hypervisor.EnableAnnotations = nil
		if _, err := c.WithAnnotations(map[string]string{annotations.DefaultVCPUs: "0"}); err != nil {
			t.Errorf("not allowlisted annotation caused %v", err)
		}
	})
}

func TestAttestationSection(t *testing.T) {
	c := Default()
	if c.Attestation.Mode != AttestRequired {
		t.Fatalf("default attestation.mode = %q, want %q", c.Attestation.Mode, AttestRequired)
	}
	c.Hypervisor.Kernel = "/usr/share/c8s/vmlinuz"
	if p := c.ManifestPath(); p != "/usr/share/c8s/manifest.json" {
		t.Fatalf("default manifest path = %q", p)
	}
	c.Attestation.Manifest = "/etc/c8s/manifest.json"
	if p := c.ManifestPath(); p != "/etc/c8s/manifest.json" {
		t.Fatalf("manifest path = %q", p)
	}
	c.Attestation.Mode = "sometimes"
	if err := c.Attestation.validate(); err == nil || !strings.Contains(err.Error(), "required, off") {
		t.Fatalf("bad attestation.mode: %v", err)
	}
	c.Attestation.Mode = AttestRequired
	c.Attestation.NodeLaunchDigests = []string{strings.Repeat("ab", 48), "0x" + strings.Repeat("01", 48)}
	if err := c.Attestation.validate(); err != nil {
		t.Fatalf("good node_launch_digests: %v", err)
	}
	c.Attestation.NodeLaunchDigests = append(c.Attestation.NodeLaunchDigests, strings.Repeat("ab", 32))
	if err := c.Attestation.validate(); err == nil || !strings.Contains(err.Error(), "node_launch_digests[2]") {
		t.Fatalf("a 32-byte node launch digest: %v", err)
	}
}

func TestHostRootfsIsRefusedByConfidentialTEEs(t *testing.T) {
	c := Default()
	if err := c.HostRootfsAllowed(); err != nil {
		t.Fatalf("sim must accept a host rootfs: %v", err)
	}
	for _, tee := range []string{"snp", "tdx"} {
		c.Hypervisor.TEE = tee
		c.Runtime.AllowHostRootfs = false
		if err := c.HostRootfsAllowed(); err == nil || !strings.Contains(err.Error(), "runtime.allow_host_rootfs") ||
			!strings.Contains(err.Error(), `runtime.rootfs = "layers"`) {
			t.Errorf("%s with a host rootfs: %v, want a refusal naming runtime.allow_host_rootfs and the image layers", tee, err)
		}
		c.Runtime.AllowHostRootfs = true
		if err := c.HostRootfsAllowed(); err != nil {
			t.Errorf("%s with allow_host_rootfs: %v", tee, err)
		}
	}
}

func TestRootfsMode(t *testing.T) {
	c, err := Parse([]byte("[runtime]\nrootfs = \"copy\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Runtime.Rootfs != RootfsCopy {
		t.Fatalf("runtime.rootfs = %q, want copy", c.Runtime.Rootfs)
	}
	if d := Default(); d.Runtime.Rootfs != RootfsLayers {
		t.Fatalf("default runtime.rootfs = %q, want %q", d.Runtime.Rootfs, RootfsLayers)
	}
	v := validConfig(t)
	v.Runtime.Rootfs = "overlay"
	if err := v.Validate(); err == nil || !strings.Contains(err.Error(), `runtime.rootfs "overlay"`) {
		t.Fatalf("runtime.rootfs = overlay: %v", err)
	}
	v.Runtime.Rootfs = RootfsLayers
	v.Runtime.LayerCacheDir = "layers"
	if err := v.Validate(); err == nil || !strings.Contains(err.Error(), "runtime.layer_cache_dir") {
		t.Fatalf("relative runtime.layer_cache_dir: %v", err)
	}
}

func TestLayerCachePath(t *testing.T) {
	for _, tc := range []struct {
		stateDir, cacheDir, layerDir, want string
	}{
		{"/run/c8s", "", "", DefaultLayerCacheDir},
		{"/run/c8s/", "", "", DefaultLayerCacheDir},
		{"/run/c8s", "/var/cache/c8s", "", "/var/cache/c8s/layers"},
		{"/tmp/c8s-test", "", "", "/tmp/c8s-test/cache/layers"},
		{"/tmp/c8s-test", "", "/srv/layers", "/srv/layers"},
		{"/run/c8s", "", "/srv/layers", "/srv/layers"},
	} {
		c := Default()
		c.Runtime.StateDir, c.Runtime.CacheDir, c.Runtime.LayerCacheDir = tc.stateDir, tc.cacheDir, tc.layerDir
		if got := c.LayerCachePath(); got != tc.want {
			t.Errorf("state_dir %q cache_dir %q layer_cache_dir %q: LayerCachePath = %q, want %q", tc.stateDir, tc.cacheDir, tc.layerDir, got, tc.want)
		}
	}
}

// attestation.collateral_dir parses, and must be an absolute path.
func TestAttestationCollateralDir(t *testing.T) {
	c, err := Parse([]byte("[attestation]\ncollateral_dir = \"/var/lib/c8s/collateral\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Attestation.CollateralDir != "/var/lib/c8s/collateral" {
		t.Fatalf("collateral_dir = %q", c.Attestation.CollateralDir)
	}
	if err := c.Attestation.validate(); err != nil {
		t.Fatalf("an absolute collateral_dir: %v", err)
	}
	c.Attestation.CollateralDir = "collateral"
	if err := c.Attestation.validate(); err == nil || !strings.Contains(err.Error(), "attestation.collateral_dir") || !strings.Contains(err.Error(), "collateral fetch") {
		t.Fatalf("a relative collateral_dir: %v", err)
	}
}
