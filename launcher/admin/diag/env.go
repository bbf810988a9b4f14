package diag

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/c8s-dev/c8s/launcher/admin/ctrdconfig"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
	"github.com/c8s-dev/c8s/manifest"
)

// EnvSchema identifies the `c8s-launcher env --json` format; fields are
// only ever added.
const EnvSchema = "c8s.io/env/v1"

// Env is what `c8s-launcher env` prints: the effective configuration,
// versions and paths, as `kata-runtime env` does. It is printed as TOML
// (the keys below) or JSON (the same structure).
type Env struct {
	Schema     string        `toml:"schema" json:"schema"`
	C8s        EnvC8s        `toml:"c8s" json:"c8s"`
	Host       EnvHost       `toml:"host" json:"host"`
	Hypervisor EnvHypervisor `toml:"hypervisor" json:"hypervisor"`
	Image      EnvImage      `toml:"image" json:"image"`
	Containerd EnvContainerd `toml:"containerd" json:"containerd"`
	Layers     EnvLayers     `toml:"layers" json:"layers"`
	// Config is the effective configuration (the file over the defaults),
	// keyed as in the TOML file in both output formats.
	Config map[string]any `toml:"config" json:"config"`
}

// EnvC8s describes c8s itself.
type EnvC8s struct {
	// Version is the module version the binary was built from ("(devel)"
	// for a source build).
	Version string `toml:"version" json:"version"`
	// Revision is the VCS revision, when the build recorded one.
	Revision   string `toml:"revision" json:"revision"`
	GoVersion  string `toml:"go_version" json:"go_version"`
	ConfigPath string `toml:"config_path" json:"config_path"`
	ShimPath   string `toml:"shim_path" json:"shim_path"`
	StateDir   string `toml:"state_dir" json:"state_dir"`
	CacheDir   string `toml:"cache_dir" json:"cache_dir"`
}

// EnvHost describes the host.
type EnvHost struct {
	KernelRelease string `toml:"kernel_release" json:"kernel_release"`
	KVMDevice     bool   `toml:"kvm_device" json:"kvm_device"`
	KVMModules    string `toml:"kvm_modules" json:"kvm_modules"`
}

// EnvHypervisor describes QEMU and the firmware.
type EnvHypervisor struct {
	Path    string `toml:"path" json:"path"`
	Version string `toml:"version" json:"version"`
	TEE     string `toml:"tee" json:"tee"`
	Accel   string `toml:"accel" json:"accel"`
	// AccelProbe is the cached verdict of the KVM probe on this host
	// ("kvm: reason" or "tcg: reason"), empty when none is cached.
	AccelProbe string `toml:"accel_probe" json:"accel_probe"`
	Firmware   string `toml:"firmware" json:"firmware"`
}

// EnvImage describes the guest image.
type EnvImage struct {
	Dir           string `toml:"dir" json:"dir"`
	Verified      bool   `toml:"verified" json:"verified"`
	Problem       string `toml:"problem" json:"problem"`
	KernelPackage string `toml:"kernel_package" json:"kernel_package"`
	KernelRelease string `toml:"kernel_release" json:"kernel_release"`
	KernelSHA256  string `toml:"kernel_sha256" json:"kernel_sha256"`
	InitrdSHA256  string `toml:"initrd_sha256" json:"initrd_sha256"`
	Runc          string `toml:"runc" json:"runc"`
}

// EnvContainerd describes containerd.
type EnvContainerd struct {
	Address       string   `toml:"address" json:"address"`
	Reachable     bool     `toml:"reachable" json:"reachable"`
	Version       string   `toml:"version" json:"version"`
	Config        string   `toml:"config" json:"config"`
	ConfigExists  bool     `toml:"config_exists" json:"config_exists"`
	ConfigVersion int      `toml:"config_version" json:"config_version"`
	ConfigFiles   []string `toml:"config_files" json:"config_files"`
	C8sHandlers   []string `toml:"c8s_handlers" json:"c8s_handlers"`
	// LoadedHandlers are the runtime handlers the running containerd's
	// CRI reports (empty when it is unreachable or serves no CRI).
	LoadedHandlers []string `toml:"loaded_handlers" json:"loaded_handlers"`
}

// EnvLayers describes the node's cache of image layer disks
// (launcher/layercache; `c8s-launcher layers list` shows each).
type EnvLayers struct {
	Dir string `toml:"dir" json:"dir"`
	// Count is the number of cached layers, Bytes their disks' sizes and
	// Allocated the host disk space they take.
	Count     int    `toml:"count" json:"count"`
	Bytes     int64  `toml:"bytes" json:"bytes"`
	Allocated int64  `toml:"allocated" json:"allocated"`
	Problem   string `toml:"problem" json:"problem"`
}

// CollectEnv gathers the environment report; configPath is the file the
// configuration came from ("" for built-in defaults). It never fails:
// what cannot be found is left empty.
func CollectEnv(ctx context.Context, o Options, configPath string) *Env {
	o.setDefaults()
	s := &state{o: &o}
	h := o.Config.Hypervisor
	e := &Env{Schema: EnvSchema, Config: configMap(o.Config)}

	e.C8s = EnvC8s{Version: "(unknown)", GoVersion: runtime.Version(), ConfigPath: configPath,
		ShimPath: o.shimPath(), StateDir: o.Config.Runtime.StateDir, CacheDir: o.Config.CachePath()}
	if e.C8s.ConfigPath == "" {
		e.C8s.ConfigPath = "(built-in defaults)"
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		e.C8s.Version = bi.Main.Version
		for _, st := range bi.Settings {
			if st.Key == "vcs.revision" {
				e.C8s.Revision = st.Value
			}
		}
	}

	if rel, err := o.readFile("/proc/sys/kernel/osrelease"); err == nil {
		e.Host.KernelRelease = strings.TrimSpace(string(rel))
	}
	e.Host.KVMDevice = o.exists("/dev/kvm")
	e.Host.KVMModules = strings.Join(o.kvmModules(), ",")

	e.Hypervisor = EnvHypervisor{Path: s.qemuPath(), TEE: h.TEE, Accel: h.Accel, Firmware: h.Firmware}
	if e.Hypervisor.Path != "" {
		if out, err := s.runQEMU(ctx, "-version"); err == nil {
			e.Hypervisor.Version = QEMUVersion(out)
		}
		if o.live() {
			if r, ok := accel.Cached(e.Hypervisor.Path, o.Config.CachePath()); ok {
				e.Hypervisor.AccelProbe = r.Accel + ": " + r.Reason
			}
		}
	}

	e.Image.Dir = o.ImageDir
	m, err := manifest.Verify(o.path(o.ImageDir))
	if err != nil {
		e.Image.Problem = o.unroot(err.Error())
	}
	if m != nil {
		e.Image.Verified = err == nil
		e.Image.KernelPackage = m.Kernel.Package
		e.Image.KernelRelease = m.Kernel.Release
		e.Image.KernelSHA256 = m.Artifacts[manifest.RoleKernel].SHA256
		e.Image.InitrdSHA256 = m.Artifacts[manifest.RoleInitrd].SHA256
		e.Image.Runc = m.Runc.Version
	}

	e.Layers.Dir = o.Config.LayerCachePath()
	if st, err := layercache.Usage(o.path(e.Layers.Dir)); err != nil {
		e.Layers.Problem = o.unroot(err.Error())
	} else {
		e.Layers.Count, e.Layers.Bytes, e.Layers.Allocated = st.Layers, st.Bytes, st.Allocated
	}

	c := &e.Containerd
	c.Address = socketPath(o.ContainerdAddress)
	c.ConfigFiles, c.C8sHandlers = []string{}, []string{}
	c.LoadedHandlers = []string{}
	if v, err := ContainerdVersion(ctx, o.Root, c.Address); err == nil {
		c.Reachable, c.Version = true, v
		if loaded, err := CRIHandlers(ctx, o.Root, c.Address); err == nil {
			c.LoadedHandlers = loaded
		}
	}
	c.Config = o.ContainerdConfig
	if cfg, err := ctrdconfig.Load(o.Root, o.ContainerdConfig); err == nil {
		c.ConfigExists, c.ConfigVersion = cfg.Exists, cfg.Version
		for _, f := range cfg.Files {
			c.ConfigFiles = append(c.ConfigFiles, f.Path)
		}
		c.C8sHandlers = append(c.C8sHandlers, cfg.C8sHandlers()...)
	}
	return e
}

// configMap turns cfg into a map keyed by its TOML keys.
func configMap(cfg config.Config) map[string]any {
	m := map[string]any{}
	data, err := toml.Marshal(cfg)
	if err == nil {
		err = toml.Unmarshal(data, &m)
	}
	if err != nil {
		m = map[string]any{"error": err.Error()}
	}
	return m
}

// WriteTOML prints the report as TOML.
func (e *Env) WriteTOML(w io.Writer) error {
	var b bytes.Buffer
	enc := toml.NewEncoder(&b)
	enc.SetIndentTables(true)
	if err := enc.Encode(e); err != nil {
		return err
	}
	_, err := w.Write(b.Bytes())
	return err
}

// WriteJSON prints the report as indented JSON.
func (e *Env) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(e)
}
