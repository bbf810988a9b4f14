package discovery

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// NVIDIA GPUs for confidential pods (the nvidia.com/confidential-gpu
// resource), read under Options.Root:
//
//	devices    /sys/bus/pci/devices/*: vendor 0x10de, class 0x0302 or 0x0300
//	model      the device ID, looked up in gpuModels (Hopper and Blackwell)
//	driver     the driver symlink: vfio-pci is required to pass it to a VM
//	IOMMU      the iommu_group symlink; every device of the group must be on
//	           vfio-pci, pci-stub, pcieport or no driver (VFIO's "viable" rule)
//	VFIO       /dev/vfio/<group> (legacy group), or /dev/iommu plus the
//	           device's vfio-dev/vfioN cdev (/dev/vfio/devices/vfioN, iommufd)
//	PCIe       the config space: a PCI Express capability (a root-port child
//	           in the VM), FLR, the extended capabilities (ATS, ACS, DOE, IDE)
//	BARs       /sys/bus/pci/devices/X/resource: the 64-bit window the VM's
//	           firmware must place (launcher/vm sizes X-PciMmio64Mb from it)
//	CC mode    the GPU CC mode file (Options.GPUCCModeFile)
//
// # CC mode
//
// A GPU's confidential-computing mode is not in sysfs. NVIDIA's tools read
// and set it through the GPU's own registers (gpu-admin-tools'
// nvidia_gpu_tools.py --query-cc-mode / --set-cc-mode=on, with the GPU on
// vfio-pci; nvidia-smi conf-compute with the nvidia driver), and the mode
// takes effect at the next GPU reset. c8s does not poke GPU registers from
// the node agent: the provisioning step that sets the mode records it in
// the CC mode file, one GPU per line:
//
//	# written by provisioning after nvidia_gpu_tools.py --set-cc-mode=on --reset-after-cc-mode-switch
//	0000:41:00.0 on
//	0000:c1:00.0 off
//
// (modes: on, off, devtools). The file only steers scheduling. It is the
// host's word, and for snp and tdx pods the host is not trusted: what a
// pod's GPU really is, and that its CC mode is on, is proven by the GPU's
// own attestation report, which the owner's key broker verifies before it
// releases secrets (launcher/broker, gpu.go).

// DefaultGPUCCModeFile is where provisioning records the GPUs' CC modes.
const DefaultGPUCCModeFile = "/etc/c8s/gpu-cc-modes"

// CC modes of an NVIDIA GPU.
const (
	CCModeOn       = "on"
	CCModeOff      = "off"
	CCModeDevtools = "devtools"
)

// VFIO drivers and the drivers VFIO accepts beside its own in a group.
const (
	DriverVFIO    = "vfio-pci"
	driverStub    = "pci-stub"
	driverPCIPort = "pcieport"
)

// GPU is one NVIDIA GPU on the PCI bus.
type GPU struct {
	// Address is the PCI address, e.g. 0000:41:00.0.
	Address  string `json:"address"`
	DeviceID uint16 `json:"deviceID"`
	Class    uint32 `json:"class"`
	// Product is the model's name from pci.ids ("" for an unknown ID) and
	// Arch its architecture ("hopper", "blackwell").
	Product string `json:"product,omitempty"`
	Arch    string `json:"arch,omitempty"`
	// CCCapable is true for the Hopper and Blackwell models in gpuModels.
	CCCapable bool `json:"ccCapable"`
	// CCMode is the mode the CC mode file gives ("" when it names the GPU
	// not, or there is no file).
	CCMode string `json:"ccMode,omitempty"`
	// Driver is the bound driver ("" for none).
	Driver string `json:"driver,omitempty"`
	// IOMMUGroup is the group number, -1 without an IOMMU.
	IOMMUGroup int `json:"iommuGroup"`
	// GroupDevices are the PCI addresses in the group, sorted.
	GroupDevices []string `json:"groupDevices,omitempty"`
	// GroupDev is /dev/vfio/<group> when it exists.
	GroupDev string `json:"groupDev,omitempty"`
	// CDev is /dev/vfio/devices/vfioN when the device has a VFIO cdev
	// and it exists.
	CDev string `json:"cdev,omitempty"`
	// PCIe, FLR and ExtCaps are from the config space.
	PCIe    bool     `json:"pcie"`
	FLR     bool     `json:"flr"`
	ExtCaps []string `json:"extCaps,omitempty"`
	// ResetMethods are the kernel's reset methods (reset_method), if known.
	ResetMethods []string `json:"resetMethods,omitempty"`
	// BARs are the memory BARs.
	BARs []BAR `json:"bars,omitempty"`
	// Usable is true when the GPU can go to a confidential pod now;
	// Reason explains it either way.
	Usable bool   `json:"usable"`
	Reason string `json:"reason"`
}

// Mem64Bytes is the total size of the GPU's 64-bit memory BARs.
func (g GPU) Mem64Bytes() uint64 {
	var n uint64
	for _, b := range g.BARs {
		if b.Mem64 {
			n += b.Size
		}
	}
	return n
}

// GPUInfo is the node's NVIDIA GPUs.
type GPUInfo struct {
	GPUs []GPU `json:"gpus,omitempty"`
	// IOMMUFD is true when /dev/iommu exists (the kernel's iommufd).
	IOMMUFD bool `json:"iommufd"`
	// CCModeFile is the CC mode file read ("" when there was none) and
	// CCModeError what was wrong with it.
	CCModeFile  string `json:"ccModeFile,omitempty"`
	CCModeError string `json:"ccModeError,omitempty"`
}

// Usable returns the GPUs that can go to confidential pods, by address.
func (g GPUInfo) Usable() []GPU {
	var out []GPU
	for _, x := range g.GPUs {
		if x.Usable {
			out = append(out, x)
		}
	}
	return out
}

var pciAddress = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// ValidPCIAddress reports whether a is a full PCI address in sysfs's
// spelling (domain:bus:device.function, lower-case hex).
func ValidPCIAddress(a string) bool { return pciAddress.MatchString(a) }

const pciDevices = "sys/bus/pci/devices"

// gpus finds the NVIDIA GPUs.
func (d host) gpus(ccFile string) GPUInfo {
	var info GPUInfo
	info.IOMMUFD = d.exists("dev/iommu")
	if ccFile == "" {
		ccFile = DefaultGPUCCModeFile
	}
	modes, err := d.ccModes(ccFile)
	switch {
	case err == nil:
		info.CCModeFile = ccFile
	case !isNotExist(err):
		info.CCModeFile, info.CCModeError = ccFile, err.Error()
	}
	entries, err := fs.ReadDir(d.fsys, pciDevices)
	if err != nil {
		return info
	}
	for _, e := range entries {
		addr := e.Name()
		if !ValidPCIAddress(addr) {
			continue
		}
		if v, ok := d.hexFile(path.Join(pciDevices, addr, "vendor")); !ok || v != NVIDIAVendor {
			continue
		}
		class, _ := d.hexFile(path.Join(pciDevices, addr, "class"))
		if c := class >> 8; c != Class3D && c != ClassVGA {
			continue // an NVSwitch, an audio function
		}
		info.GPUs = append(info.GPUs, d.gpu(addr, uint32(class), modes, info))
	}
	return info
}

func (d host) gpu(addr string, class uint32, modes map[string]string, info GPUInfo) GPU {
	dir := path.Join(pciDevices, addr)
	dev, _ := d.hexFile(path.Join(dir, "device"))
	g := GPU{Address: addr, DeviceID: uint16(dev), Class: class, IOMMUGroup: -1, CCMode: modes[addr]}
	if m, ok := gpuModels[g.DeviceID]; ok {
		g.Product, g.Arch, g.CCCapable = m.Name, m.Arch, true
	}
	g.Driver = d.linkBase(path.Join(dir, "driver"))
	if grp := d.linkBase(path.Join(dir, "iommu_group")); grp != "" {
		if n, err := strconv.Atoi(grp); err == nil {
			g.IOMMUGroup = n
		}
	}
	var groupProblem string
	if g.IOMMUGroup >= 0 {
		g.GroupDevices, groupProblem = d.groupViable(g.IOMMUGroup)
		if p := fmt.Sprintf("dev/vfio/%d", g.IOMMUGroup); d.exists(p) {
			g.GroupDev = "/" + p
		}
	}
	if cdevs, err := fs.ReadDir(d.fsys, path.Join(dir, "vfio-dev")); err == nil && len(cdevs) == 1 {
		if p := "dev/vfio/devices/" + cdevs[0].Name(); d.exists(p) {
			g.CDev = "/" + p
		}
	}
	var cfgProblem string
	if raw, err := fs.ReadFile(d.fsys, path.Join(dir, "config")); err != nil {
		cfgProblem = "its config space is unreadable"
	} else if c, err := parsePCIConfig(raw); err != nil {
		cfgProblem = "its config space: " + err.Error()
	} else if c.Vendor != NVIDIAVendor || c.Device != g.DeviceID {
		cfgProblem = fmt.Sprintf("its config space says %04x:%04x, sysfs %04x:%04x", c.Vendor, c.Device, NVIDIAVendor, g.DeviceID)
	} else {
		g.PCIe, g.FLR, g.ExtCaps = c.PCIe, c.FLR, c.ExtCaps
	}
	if raw, err := fs.ReadFile(d.fsys, path.Join(dir, "reset_method")); err == nil {
		g.ResetMethods = strings.Fields(string(raw))
	}
	if raw, err := fs.ReadFile(d.fsys, path.Join(dir, "resource")); err == nil {
		g.BARs, _ = parseResource(raw)
	}
	g.Usable, g.Reason = judgeGPU(g, cfgProblem, groupProblem, info)
	return g
}

// judgeGPU says whether g can be passed to a confidential pod, and why
// (or why not: the first requirement not met, with what to do).
func judgeGPU(g GPU, cfgProblem, groupProblem string, info GPUInfo) (bool, string) {
	switch {
	case !g.CCCapable:
		return false, fmt.Sprintf("device ID %04x is not a confidential-computing capable GPU c8s knows (Hopper or Blackwell)", g.DeviceID)
	case g.CCMode != CCModeOn:
		why := "the CC mode file does not name it"
		switch {
		case info.CCModeError != "":
			why = "the CC mode file " + info.CCModeFile + " is unreadable: " + info.CCModeError
		case info.CCModeFile == "":
			why = "there is no CC mode file"
		case g.CCMode != "":
			why = "its CC mode is " + g.CCMode
		}
		return false, why + ": set it with nvidia_gpu_tools.py --set-cc-mode=on --reset-after-cc-mode-switch and record \"" + g.Address + " on\" in the CC mode file"
	case g.Driver != DriverVFIO:
		drv := g.Driver
		if drv == "" {
			drv = "no driver"
		}
		return false, "it is bound to " + drv + ", not vfio-pci: bind it to vfio-pci (driver_override) to pass it to a VM"
	case g.IOMMUGroup < 0:
		return false, "it is in no IOMMU group: enable the IOMMU (amd_iommu=on / intel_iommu=on) in the BIOS and kernel"
	case groupProblem != "":
		return false, fmt.Sprintf("IOMMU group %d is not viable: %s", g.IOMMUGroup, groupProblem)
	case g.GroupDev == "" && g.CDev == "":
		return false, fmt.Sprintf("neither /dev/vfio/%d nor a VFIO cdev exists", g.IOMMUGroup)
	case cfgProblem != "":
		return false, cfgProblem
	case !g.PCIe:
		return false, "its config space has no PCI Express capability: c8s places GPUs on PCIe root ports"
	}
	how := "VFIO group " + g.GroupDev
	if info.IOMMUFD && g.CDev != "" {
		how = "iommufd and " + g.CDev
	}
	reason := fmt.Sprintf("CC mode on, vfio-pci, IOMMU group %d viable, %s", g.IOMMUGroup, how)
	if !g.FLR && len(g.ResetMethods) == 0 {
		reason += "; no reset method known (no FLR): VFIO may not reset it between pods"
	}
	return true, reason
}

// groupViable lists the devices of IOMMU group n and says what keeps the
// group from VFIO ("" when nothing does): every device must be on
// vfio-pci, pci-stub or no driver, bridges may be on pcieport.
func (d host) groupViable(n int) ([]string, string) {
	entries, err := fs.ReadDir(d.fsys, fmt.Sprintf("sys/kernel/iommu_groups/%d/devices", n))
	if err != nil {
		return nil, "its device list is unreadable"
	}
	var devs, bad []string
	for _, e := range entries {
		devs = append(devs, e.Name())
		drv := d.linkBase(path.Join(pciDevices, e.Name(), "driver"))
		switch drv {
		case "", DriverVFIO, driverStub:
			continue
		case driverPCIPort:
			if c, _ := d.hexFile(path.Join(pciDevices, e.Name(), "class")); c>>8 == ClassBridge {
				continue
			}
		}
		bad = append(bad, e.Name()+" is bound to "+drv)
	}
	sort.Strings(devs)
	if len(bad) > 0 {
		return devs, strings.Join(bad, ", ") + " (bind every device of the group to vfio-pci)"
	}
	return devs, ""
}

// ccModes reads the CC mode file: "ADDRESS MODE" lines, # comments.
func (d host) ccModes(file string) (map[string]string, error) {
	data, err := fs.ReadFile(d.fsys, strings.TrimPrefix(path.Clean("/"+file), "/"))
	if err != nil {
		return nil, err
	}
	modes := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 || !ValidPCIAddress(f[0]) {
			return nil, fmt.Errorf("line %d: want \"0000:41:00.0 on\", got %q", n, sc.Text())
		}
		switch f[1] {
		case CCModeOn, CCModeOff, CCModeDevtools:
		default:
			return nil, fmt.Errorf("line %d: mode %q is not on, off or devtools", n, f[1])
		}
		if _, dup := modes[f[0]]; dup {
			return nil, fmt.Errorf("line %d: %s is listed twice", n, f[0])
		}
		modes[f[0]] = f[1]
	}
	return modes, nil
}

// hexFile reads a sysfs number such as "0x10de".
func (d host) hexFile(p string) (uint64, bool) {
	data, err := fs.ReadFile(d.fsys, p)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(data)), "0x"), 16, 32)
	return v, err == nil
}

// linkBase is the last element of a symlink's target ("" when p is no
// symlink).
func (d host) linkBase(p string) string {
	target, err := fs.ReadLink(d.fsys, p)
	if err != nil {
		return ""
	}
	return path.Base(target)
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// DiscoverGPUs finds the NVIDIA GPUs under root ("" for "/") alone, with
// the CC mode file ccModeFile (read under root; "" for the default): what
// the shim re-checks when it cold-plugs a pod's GPUs.
func DiscoverGPUs(root, ccModeFile string) (GPUInfo, error) {
	if root == "" {
		root = "/"
	}
	d := host{fsys: os.DirFS(root), root: root}
	if _, err := fs.Stat(d.fsys, "."); err != nil {
		return GPUInfo{}, fmt.Errorf("discovery: root %q is not readable: %w", root, err)
	}
	return d.gpus(ccModeFile), nil
}

// Find returns the GPU at PCI address addr.
func (g GPUInfo) Find(addr string) (GPU, bool) {
	for _, x := range g.GPUs {
		if x.Address == addr {
			return x, true
		}
	}
	return GPU{}, false
}
