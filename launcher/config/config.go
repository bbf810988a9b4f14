// Package config is the c8s node/runtime configuration: one TOML file that
// says which QEMU, guest kernel, initrd and firmware to use, how large a pod
// VM is, which accelerator and which TEE backend to use.
//
// A minimal file:
//
//	[hypervisor]
//	kernel = "/usr/share/c8s/vmlinuz"
//	initrd = "/usr/share/c8s/initrd.img"
//	tee = "sim"                  # sim | snp | tdx
//	accel = "auto"               # auto | kvm | tcg
//	enable_annotations = ["default_vcpus", "default_memory"]
//
//	[hypervisor.snp]
//	cbitpos = 51
//	reduced_phys_bits = 1
//	policy = 0x30000
//
//	[runtime]
//	state_dir = "/run/c8s"
//	rootfs = "layers"            # layers | copy (see Runtime.Rootfs)
//	layer_cache_dir = "/var/lib/c8s/layers"
//	guest_pull = "auto"          # auto | always | never (see Runtime.GuestPull)
//
// The optional [node] table (see Node) says what the node agent reports to
// Kubernetes: sim slots, trust pool and taint.
//
// Load decodes strictly: a key the launcher does not know is an error that
// names the key and its line, so that typos do not silently fall back to
// defaults.
//
// # Growing a pod VM
//
// hypervisor.default_maxvcpus and default_maxmemory (MiB) give pod VMs room
// to grow by vCPU and memory hot-plug when a container's CPU or memory limit
// is raised beyond what its VM has (CRI UpdateContainerResources, see
// shim/task). Unset, a VM keeps its boot size and such an update is refused
// with the key to set. snp and tdx refuse both keys (HotplugRefusal says
// why); their pods are sized at start.
//
// # Pod annotations
//
// A pod may override a few settings through Kata-compatible annotations, but
// only those whose name is listed in hypervisor.enable_annotations (the part
// after "io.katacontainers.config.hypervisor."). Annotations that are not
// allowlisted, and annotations c8s does not know, are ignored. The honoured
// annotations are:
//
//	io.katacontainers.config.hypervisor.default_vcpus   allowlist name "default_vcpus"
//	    number of vCPUs, a positive integer (1..MaxVCPUs)
//	io.katacontainers.config.hypervisor.default_memory  allowlist name "default_memory"
//	    guest memory in MiB, an integer (MinMemoryMiB..MaxMemoryMiB)
//	io.katacontainers.config.hypervisor.kernel_params   allowlist name "kernel_params"
//	    extra guest kernel parameters, appended after hypervisor.kernel_params
//
// An allowlisted annotation with an invalid value makes the pod fail with an
// error naming the annotation. Paths (kernel, initrd, firmware, hypervisor)
// cannot be overridden by annotations: they change what is measured.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// Defaults.
const (
	DefaultQEMUPath  = "/usr/bin/qemu-system-x86_64"
	DefaultVCPUs     = 1
	DefaultMemoryMiB = 512
	DefaultAccel     = "auto"
	DefaultTEE       = "sim"
	DefaultStateDir  = "/run/c8s"

	// MaxVCPUs is the largest vCPU count accepted from configuration or annotations.
	MaxVCPUs = 256
	// MinMemoryMiB and MaxMemoryMiB bound the guest memory size.
	MinMemoryMiB = 64
	MaxMemoryMiB = 1 << 20
	// HotplugMemoryStepMiB is the granularity of memory hot-plug: the
	// guest kernel's memory block size on x86-64.
	HotplugMemoryStepMiB = 128
)

// Accelerator names accepted in hypervisor.accel.
var AccelNames = []string{"auto", "kvm", "tcg"}

// TEENames lists the TEE names accepted in hypervisor.tee. It must match the
// backends registered in launcher/vm/tee (a test there checks it).
var TEENames = []string{"sim", "snp", "tdx"}

// Config is the whole configuration file.
type Config struct {
	Hypervisor  Hypervisor  `toml:"hypervisor"`
	Runtime     Runtime     `toml:"runtime"`
	Node        Node        `toml:"node"`
	Attestation Attestation `toml:"attestation"`
	Migration   Migration   `toml:"migration"`
	Devices     Devices     `toml:"devices"`
}

// Hypervisor describes the QEMU VM every pod gets.
type Hypervisor struct {
	// Path is the qemu-system-x86_64 binary; a name without a slash is
	// looked up in PATH.
	Path string `toml:"path"`
	// Kernel is the guest kernel (bzImage), booted directly.
	Kernel string `toml:"kernel"`
	// Initrd is the guest initramfs.
	Initrd string `toml:"initrd"`
	// Rootfs is a sealed image's root disk: its file system followed by
	// the dm-verity hash tree, attached read-only as the first virtio-blk
	// disk. Empty means the rootfs artefact of the image manifest
	// (attestation.manifest), when that image is sealed; the manifest also
	// gives the verity parameters the launcher puts on the command line.
	Rootfs string `toml:"rootfs"`
	// Firmware is OVMF/TDVF, passed as -bios. Required for snp and tdx,
	// optional for sim (without it QEMU uses SeaBIOS).
	Firmware string `toml:"firmware"`
	// IGVM, with tee = "snp", launches this IGVM file (firmware, SEV
	// metadata and the kernel hashes table, e.g. the image's snp.igvm)
	// through QEMU's igvm-cfg (QEMU ≥ 10.1) instead of -bios and
	// kernel-hashes=on. Kernel, initrd and command line are still handed to
	// QEMU; the hashes table inside the IGVM pins them.
	IGVM string `toml:"igvm"`
	// KernelParams is appended to the built-in kernel parameters.
	KernelParams string `toml:"kernel_params"`
	// DefaultVCPUs is the number of vCPUs of a pod VM.
	DefaultVCPUs uint32 `toml:"default_vcpus"`
	// DefaultMemoryMiB is the guest memory of a pod VM in MiB.
	DefaultMemoryMiB uint32 `toml:"default_memory"`
	// DefaultMaxVCPUs, when above DefaultVCPUs, is how many vCPUs a pod VM
	// may grow to by CPU hot-plug when a container's CPU limit is raised
	// beyond what the VM has (CRI UpdateContainerResources). The VM then
	// starts with QEMU's -smp maxcpus (not measured: the launch digest
	// covers the boot vCPUs). 0 (the default): the VM cannot grow. Not for
	// snp and tdx (see Validate).
	DefaultMaxVCPUs uint32 `toml:"default_maxvcpus"`
	// DefaultMaxMemoryMiB, when above DefaultMemoryMiB, is the memory in
	// MiB a pod VM may grow to by memory hot-plug (pc-dimm, in steps of
	// HotplugMemoryStepMiB), likewise. 0 (the default): the VM cannot grow.
	// Not for snp and tdx.
	DefaultMaxMemoryMiB uint32 `toml:"default_maxmemory"`
	// Accel is "auto", "kvm" or "tcg".
	Accel string `toml:"accel"`
	// TEE is the confidential computing backend: "sim", "snp" or "tdx".
	TEE string `toml:"tee"`
	// EnableAnnotations lists the annotations pods may set (see the package doc).
	EnableAnnotations []string `toml:"enable_annotations"`
	// SNP configures the AMD SEV-SNP backend.
	SNP SNPConfig `toml:"snp"`
	// TDX configures the Intel TDX backend.
	TDX TDXConfig `toml:"tdx"`
	// VirtioFSDaemon, when set, is the virtiofsd binary (Debian 12:
	// /usr/lib/qemu/virtiofsd) that shares the host directories of
	// containers' bind mounts into the VM over virtio-fs. Empty: host
	// directories are not shared (only small files, by value). Such VMs
	// cannot live-migrate (QEMU 7.2).
	VirtioFSDaemon string `toml:"virtio_fs_daemon"`
}

// SNPConfig are the sev-snp-guest object properties.
type SNPConfig struct {
	// CBitPos is the C-bit position in guest page table entries (default 51).
	CBitPos uint32 `toml:"cbitpos"`
	// ReducedPhysBits is the physical address space reduction (default 1).
	ReducedPhysBits uint32 `toml:"reduced_phys_bits"`
	// Policy is the SNP guest policy (default 0x30000: SMT allowed, reserved bit 17).
	Policy uint64 `toml:"policy"`
	// HostData is 32 bytes, hex encoded, put into the attestation report's
	// HOST_DATA field (empty: all zero).
	HostData string `toml:"host_data"`
	// IDBlock and IDAuth are the base64 ID block (96 bytes) and ID
	// authentication structure (4096 bytes); both or neither.
	IDBlock string `toml:"id_block"`
	IDAuth  string `toml:"id_auth"`
}

// TDXConfig are the tdx-guest object properties.
type TDXConfig struct {
	// MRConfigID is up to 48 bytes, hex encoded, reported as MRCONFIGID in
	// the TD quote (empty: all zero).
	MRConfigID string `toml:"mrconfigid"`
	// QuoteGenerationSocket is where QEMU reaches the quote generation
	// service: an absolute unix socket path, or "vsock:<port>" for the host
	// (CID 2). Empty: /var/run/tdx-qgs/qgs.socket.
	QuoteGenerationSocket string `toml:"quote_generation_socket"`
}

// Runtime holds node-side settings that are not about the VM itself.
type Runtime struct {
	// StateDir holds one directory per pod VM (sockets, console log), laid
	// out by launcher/config/statedir; at most statedir.MaxRoot (40) bytes, so
	// that every unix socket below it fits.
	StateDir string `toml:"state_dir"`
	// Debug enables debug logging.
	Debug bool `toml:"debug"`
	// CacheDir holds node-wide caches such as the accelerator probe result
	// (default: <state_dir>/cache).
	CacheDir string `toml:"cache_dir"`
	// AllowHostRootfs lets snp and tdx pods run containers whose root
	// filesystem the host copies from containerd's snapshot (the "copy"
	// rootfs, RootfsCopy), which the guest cannot verify. Off by default
	// there: a confidential pod must not run code the host can change.
	// Image layers (RootfsLayers) need no such permission: the guest opens
	// each through dm-verity. The sim TEE always allows the copy.
	AllowHostRootfs bool `toml:"allow_host_rootfs"`
	// Rootfs is how a container's root filesystem reaches the pod VM:
	// RootfsLayers (the default) attaches the image's layers, each a
	// read-only disk with a dm-verity tree built once per node into the
	// layer cache (LayerCachePath) and shared by every pod; RootfsCopy
	// copies containerd's snapshot into a disk per container, as before.
	// In layer mode a container that has no image in containerd, or whose
	// layer blobs are gone from the content store, gets the copy where
	// HostRootfsAllowed allows it.
	Rootfs string `toml:"rootfs"`
	// LayerCacheDir holds the node's layer disks (see LayerCachePath).
	LayerCacheDir string `toml:"layer_cache_dir"`
	// GuestPull says when a container whose policy rule names an image
	// for the guest to pull (policy pull = "…@sha256:…") gets no layer
	// disks, so that the guest pulls and verifies the image itself:
	// GuestPullAuto (the default) where the rule pins no layers (the
	// guest would refuse the node's disks) or the node's layer cache
	// lacks one of them (converting them would cost more than the pull);
	// GuestPullAlways for every such container; GuestPullNever for none
	// (its rule must then pin layers the node offers).
	GuestPull string `toml:"guest_pull"`
}

// Values of runtime.guest_pull ("" is GuestPullAuto).
const (
	GuestPullAuto   = "auto"
	GuestPullAlways = "always"
	GuestPullNever  = "never"
)

// Values of runtime.rootfs.
const (
	RootfsLayers = "layers"
	RootfsCopy   = "copy"
)

// DefaultLayerCacheDir is the layer cache of a node that keeps the default
// runtime.state_dir: on disk, since /run is memory.
const DefaultLayerCacheDir = "/var/lib/c8s/layers"

// LayerCachePath returns where the node's layer disks are cached:
// runtime.layer_cache_dir; else, on a node with the default state_dir and
// no cache_dir, DefaultLayerCacheDir; else <cache_dir>/layers, so that a
// private state_dir (a second runtime on a node, a test) keeps its own
// layers beside its own state.
func (c *Config) LayerCachePath() string {
	switch {
	case c.Runtime.LayerCacheDir != "":
		return c.Runtime.LayerCacheDir
	case c.Runtime.CacheDir == "" && filepath.Clean(c.Runtime.StateDir) == DefaultStateDir:
		return DefaultLayerCacheDir
	}
	return filepath.Join(c.CachePath(), "layers")
}

// HostRootfsAllowed reports whether containers may run from a rootfs the
// host copies from containerd's snapshot (RootfsCopy), and if not, why.
// It does not govern image layers (RootfsLayers), which the guest
// verifies.
func (c *Config) HostRootfsAllowed() error {
	if c.Hypervisor.TEE == "sim" || c.Runtime.AllowHostRootfs {
		return nil
	}
	return fmt.Errorf("tee %s does not trust a container rootfs copied by the host (containerd's snapshot, unverified in the VM): "+
		"run the container from an image whose layers are in containerd's content store (runtime.rootfs = %q, the default; "+
		"keep discard_unpacked_layers = false in containerd's CRI image config), "+
		"or set runtime.allow_host_rootfs = true to accept that risk", c.Hypervisor.TEE, RootfsLayers)
}

// Default returns the configuration used for every key a file leaves out.
func Default() Config {
	return Config{
		Hypervisor: Hypervisor{
			Path:             DefaultQEMUPath,
			DefaultVCPUs:     DefaultVCPUs,
			DefaultMemoryMiB: DefaultMemoryMiB,
			Accel:            DefaultAccel,
			TEE:              DefaultTEE,
			SNP: SNPConfig{
				CBitPos:         51,
				ReducedPhysBits: 1,
				Policy:          0x30000,
			},
		},
		Runtime:     Runtime{StateDir: DefaultStateDir, Rootfs: RootfsLayers},
		Node:        Node{Taint: DefaultTaint},
		Attestation: Attestation{Mode: AttestRequired},
	}
}

// Load reads the TOML file at path over Default(). Unknown keys and type
// errors are reported with the file path and line.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("config file %s does not exist: create it or pass another file", path)
		}
		return nil, fmt.Errorf("reading config file: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes TOML data over Default(); errors carry the line number.
func Parse(data []byte) (*Config, error) {
	cfg := Default()
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return nil, describeDecodeError(data, err)
	}
	return &cfg, nil
}

func describeDecodeError(data []byte, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) && len(strict.Errors) > 0 {
		var parts []string
		for _, e := range strict.Errors {
			row, _ := e.Position()
			parts = append(parts, fmt.Sprintf("line %d: unknown key %q", row, strings.Join(e.Key(), ".")))
		}
		return fmt.Errorf("%s (check the spelling; see launcher/config for the known keys)", strings.Join(parts, "; "))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		key := strings.Join(de.Key(), ".")
		if key == "" {
			key = keyOnLine(data, row)
		}
		if key != "" {
			return fmt.Errorf("line %d column %d (key %q): %s", row, col, key, de.Error())
		}
		return fmt.Errorf("line %d column %d: %s", row, col, de.Error())
	}
	return err
}

// keyOnLine returns the key assigned on line row (1-based) of data, if any.
func keyOnLine(data []byte, row int) string {
	lines := strings.Split(string(data), "\n")
	if row < 1 || row > len(lines) {
		return ""
	}
	k, _, ok := strings.Cut(lines[row-1], "=")
	if !ok {
		return ""
	}
	return strings.Trim(strings.TrimSpace(k), `"'`)
}

// Validate checks values and that the files the VM needs exist.
func (c *Config) Validate() error {
	h := &c.Hypervisor
	var errs []error
	if !contains(TEENames, h.TEE) {
		errs = append(errs, fmt.Errorf("hypervisor.tee %q is not a known TEE; valid names: %s", h.TEE, strings.Join(TEENames, ", ")))
	}
	if !contains(AccelNames, h.Accel) {
		errs = append(errs, fmt.Errorf("hypervisor.accel %q is not valid; use one of: %s", h.Accel, strings.Join(AccelNames, ", ")))
	}
	if h.DefaultVCPUs < 1 || h.DefaultVCPUs > MaxVCPUs {
		errs = append(errs, fmt.Errorf("hypervisor.default_vcpus %d is out of range 1..%d", h.DefaultVCPUs, MaxVCPUs))
	}
	if h.DefaultMemoryMiB < MinMemoryMiB || h.DefaultMemoryMiB > MaxMemoryMiB {
		errs = append(errs, fmt.Errorf("hypervisor.default_memory %d MiB is out of range %d..%d", h.DefaultMemoryMiB, MinMemoryMiB, MaxMemoryMiB))
	}
	errs = append(errs, h.validateHotplug()...)
	for _, name := range h.EnableAnnotations {
		if _, ok := annotationSetters[name]; !ok {
			errs = append(errs, fmt.Errorf("hypervisor.enable_annotations: %q is not an annotation c8s honours; known: %s", name, strings.Join(AnnotationNames(), ", ")))
		}
	}
	if _, err := h.QEMUBinary(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, checkFile("hypervisor.kernel", h.Kernel, "run `make image` or set hypervisor.kernel to a guest kernel"))
	errs = append(errs, checkFile("hypervisor.initrd", h.Initrd, "run `make image` or set hypervisor.initrd to a guest initramfs"))
	if h.Firmware != "" || (h.TEE == "snp" && h.IGVM == "") || h.TEE == "tdx" {
		errs = append(errs, checkFile("hypervisor.firmware", h.Firmware, "install ovmf (/usr/share/ovmf/OVMF.fd) or set hypervisor.firmware; snp and tdx need it"))
	}
	if h.Rootfs != "" {
		errs = append(errs, checkFile("hypervisor.rootfs", h.Rootfs, "run `make image` or unset hypervisor.rootfs to use the image manifest's"))
	}
	if h.IGVM != "" {
		if h.TEE != "snp" {
			errs = append(errs, fmt.Errorf("hypervisor.igvm is set but hypervisor.tee is %q: IGVM launch is for snp", h.TEE))
		}
		if h.Firmware != "" {
			errs = append(errs, errors.New("hypervisor.igvm and hypervisor.firmware are both set: the IGVM file carries the firmware; unset hypervisor.firmware"))
		}
		errs = append(errs, checkFile("hypervisor.igvm", h.IGVM, "run `make image` (snp.igvm) or unset hypervisor.igvm"))
	}
	if c.Node.SimSlots < -1 {
		errs = append(errs, fmt.Errorf("node.sim_slots %d is not valid: use a slot count, 0 to size from host memory, or -1 for none", c.Node.SimSlots))
	}
	if err := c.Attestation.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Migration.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Runtime.Rootfs != RootfsLayers && c.Runtime.Rootfs != RootfsCopy {
		errs = append(errs, fmt.Errorf("runtime.rootfs %q is not valid: use %q (image layers, verified in the guest) or %q (a copy of containerd's snapshot)", c.Runtime.Rootfs, RootfsLayers, RootfsCopy))
	}
	switch c.Runtime.GuestPull {
	case "", GuestPullAuto, GuestPullAlways, GuestPullNever:
	default:
		errs = append(errs, fmt.Errorf("runtime.guest_pull %q is not valid: use %q, %q or %q", c.Runtime.GuestPull, GuestPullAuto, GuestPullAlways, GuestPullNever))
	}
	if c.Runtime.LayerCacheDir != "" && !filepath.IsAbs(c.Runtime.LayerCacheDir) {
		errs = append(errs, fmt.Errorf("runtime.layer_cache_dir %q must be an absolute path", c.Runtime.LayerCacheDir))
	}
	if c.Runtime.StateDir == "" || !filepath.IsAbs(c.Runtime.StateDir) {
		errs = append(errs, fmt.Errorf("runtime.state_dir %q must be an absolute path", c.Runtime.StateDir))
	} else if n := len(filepath.Clean(c.Runtime.StateDir)); n > statedir.MaxRoot {
		errs = append(errs, fmt.Errorf("runtime.state_dir %q is %d bytes, longer than the %d that leave room below it for the pod VMs' unix sockets (at most %d bytes a path): use a shorter directory such as %s",
			c.Runtime.StateDir, n, statedir.MaxRoot, statedir.UnixPathMax, DefaultStateDir))
	}
	return errors.Join(errs...)
}

// CachePath returns runtime.cache_dir, defaulting to <state_dir>/cache.
func (c *Config) CachePath() string {
	if c.Runtime.CacheDir != "" {
		return c.Runtime.CacheDir
	}
	return filepath.Join(c.Runtime.StateDir, "cache")
}

// QEMUBinary resolves Path: a name without a slash is looked up in PATH.
func (h Hypervisor) QEMUBinary() (string, error) {
	if h.Path == "" {
		return "", errors.New("hypervisor.path is empty: set it to qemu-system-x86_64")
	}
	if !strings.Contains(h.Path, "/") {
		p, err := exec.LookPath(h.Path)
		if err != nil {
			return "", fmt.Errorf("hypervisor.path %q not found in PATH: install qemu-system-x86 or set an absolute path", h.Path)
		}
		return p, nil
	}
	if _, err := os.Stat(h.Path); err != nil {
		return "", fmt.Errorf("hypervisor.path %s: %w (install qemu-system-x86 or fix the path)", h.Path, err)
	}
	return h.Path, nil
}

func checkFile(key, path, fix string) error {
	if path == "" {
		return fmt.Errorf("%s is not set: %s", key, fix)
	}
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s %s does not exist: %s", key, path, fix)
		}
		return fmt.Errorf("%s: %w", key, err)
	}
	if st.IsDir() {
		return fmt.Errorf("%s %s is a directory, not a file: %s", key, path, fix)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
