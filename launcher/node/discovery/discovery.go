// Package discovery finds out what confidential capacity this node has:
// AMD SEV-SNP (and its ASIDs), Intel TDX (and its private keys), Intel SGX
// (and its EPC), whether KVM runs guests, how many simulated (sim) pod VMs
// it may host, and whether the node itself is a confidential VM
// (node-as-CVM).
//
// Everything is read through Options.Root (a filesystem root: "/" on a
// node, a fixture tree in tests) and Options.CPUID, so every rule here is
// tested against fixture trees in testdata/:
//
//	SEV-SNP   enabled: /sys/module/kvm_amd/parameters/sev_snp is Y and /dev/sev exists
//	          ASIDs:   misc cgroup "sev_es" (SNP guests use SEV-ES ASIDs), else CPUID 0x8000001F
//	          usage:   misc.current "sev_es" (all SEV-ES/SNP VMs on the host, c8s or not)
//	          firmware: SEV_PLATFORM_STATUS on /dev/sev (real root only)
//	TDX       enabled: /sys/module/kvm_intel/parameters/tdx is Y; keys: misc "tdx"
//	SGX       enabled: /dev/sgx_enclave exists; EPC: misc "sgx_epc", else CPUID 0x12
//	KVM       /dev/kvm exists; usable only as launcher/vm/accel's probe says
//	sim       slots from configuration, or from /proc/meminfo when set to auto
//	node-CVM  /dev/sev-guest (SNP), /dev/tdx_guest (TDX), /sys/kernel/config/tsm/report
//	GPUs      NVIDIA GPUs for confidential pods: /sys/bus/pci/devices, IOMMU
//	          groups, /dev/vfio, the config space, the CC mode file (gpu.go)
//
// The misc cgroup files are read from the cgroup v2 root
// (/sys/fs/cgroup/misc.*) or the cgroup v1 misc hierarchy
// (/sys/fs/cgroup/misc/misc.*).
//
// A hardware TEE counts as usable (Usable methods) only when it is enabled,
// its capacity is known and non-zero, and KVM is not known to be unusable:
// SNP and TDX guests cannot run under TCG.
package discovery

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/c8s-dev/c8s/launcher/vm/accel"
)

// TEE names, as in hypervisor.tee.
const (
	SNP = "snp"
	TDX = "tdx"
	Sim = "sim"
)

// Sizing of sim slots when they are derived from host memory.
const (
	// DefaultSlotOverheadMiB is the host memory a pod VM needs on top of
	// its guest memory: QEMU's own RSS beyond guest RAM, the shim, page
	// tables. It matches the RuntimeClass overhead in packaging/.
	DefaultSlotOverheadMiB = 384
	// HostReserveMiB is left to the host (kubelet, containerd, system).
	HostReserveMiB = 1024
)

// Options says where and how to look.
type Options struct {
	// Root is the filesystem root sysfs, procfs and /dev are read under.
	// Empty means "/".
	Root string
	// CPUID executes CPUID. Nil means HostCPUID when Root is "/" (the real
	// host), and no CPUID otherwise (a fixture tree describes no CPU).
	CPUID CPUIDFunc
	// SEVFirmware reads the SEV firmware version given the /dev/sev path.
	// Nil means HostSEVFirmware when Root is "/", and none otherwise.
	SEVFirmware func(devPath string) (string, error)
	// KVMProbe is launcher/vm/accel's result for this node (accel.Choose with
	// mode "auto"), if the caller has one. Nil: not probed.
	KVMProbe *accel.Result
	// SimSlots is the number of sim pod VMs the node offers: > 0 exactly
	// that many, 0 derive them from host memory, < 0 none.
	SimSlots int
	// SimSlotMemoryMiB is the guest memory of one sim pod VM, used when
	// SimSlots is 0 (default: 512).
	SimSlotMemoryMiB int
	// GPUCCModeFile is the file provisioning records the GPUs' CC modes
	// in, read under Root (default DefaultGPUCCModeFile; see gpu.go).
	GPUCCModeFile string
}

// Capacity is a countable resource and how much of it is in use.
type Capacity struct {
	// Total is the capacity; meaningful only when Known.
	Total int64 `json:"total"`
	Known bool  `json:"known"`
	// Used is the host-wide usage (every VM, c8s's or not); meaningful
	// only when UsedKnown.
	Used      int64 `json:"used"`
	UsedKnown bool  `json:"usedKnown"`
	// Source names where Total came from (a file or a CPUID leaf).
	Source string `json:"source,omitempty"`
}

// Free is Total-Used when both are known, else Total.
func (c Capacity) Free() int64 {
	if c.UsedKnown && c.Used <= c.Total {
		return c.Total - c.Used
	}
	return c.Total
}

// SNPInfo is AMD SEV-SNP.
type SNPInfo struct {
	// Enabled is true when kvm_amd has SEV-SNP on and /dev/sev exists.
	Enabled bool `json:"enabled"`
	// Reason explains Enabled (and a capacity problem) in one sentence.
	Reason string `json:"reason"`
	// ASIDs are the SEV-ES/SNP ASIDs: one per SNP pod VM.
	ASIDs Capacity `json:"asids"`
	// SEVASIDs are the plain SEV ASIDs (not used by c8s; for reports).
	SEVASIDs Capacity `json:"sevAsids"`
	// Firmware is the SEV firmware version, when readable.
	Firmware string `json:"firmware,omitempty"`
}

// TDXInfo is Intel TDX.
type TDXInfo struct {
	Enabled bool   `json:"enabled"`
	Reason  string `json:"reason"`
	// Keys are the TDX private keys (HKIDs): one per TD pod VM.
	Keys Capacity `json:"keys"`
}

// SGXInfo is Intel SGX.
type SGXInfo struct {
	Enabled bool   `json:"enabled"`
	Reason  string `json:"reason"`
	// EPCBytes is the enclave page cache size in bytes.
	EPCBytes Capacity `json:"epcBytes"`
}

// KVMInfo is KVM.
type KVMInfo struct {
	// Device is true when /dev/kvm exists.
	Device bool `json:"device"`
	// Probe is launcher/vm/accel's verdict, when one was passed in.
	Probe *accel.Result `json:"probe,omitempty"`
}

// Usable is true when /dev/kvm exists and the probe chose KVM.
func (k KVMInfo) Usable() bool {
	return k.Device && k.Probe != nil && k.Probe.Accel == accel.KVM
}

// knownUnusable is true when a probe said KVM does not run guests here, or
// there is no /dev/kvm at all.
func (k KVMInfo) knownUnusable() bool {
	return !k.Device || (k.Probe != nil && k.Probe.Accel != accel.KVM)
}

// SimInfo is the simulated TEE.
type SimInfo struct {
	// Slots is how many sim pod VMs the node offers.
	Slots  int64  `json:"slots"`
	Reason string `json:"reason"`
}

// NodeCVMInfo says whether this node itself is a confidential VM.
type NodeCVMInfo struct {
	// TEE is "snp" or "tdx" when the node is such a guest, else "".
	TEE string `json:"tee,omitempty"`
	// SEVGuest and TDXGuest are the guest attestation devices.
	SEVGuest bool `json:"sevGuest"`
	TDXGuest bool `json:"tdxGuest"`
	// TSMReport is true when configfs-tsm reports are available
	// (/sys/kernel/config/tsm/report).
	TSMReport bool `json:"tsmReport"`
}

// Result is everything discovery found.
type Result struct {
	SNP     SNPInfo     `json:"snp"`
	TDX     TDXInfo     `json:"tdx"`
	SGX     SGXInfo     `json:"sgx"`
	KVM     KVMInfo     `json:"kvm"`
	Sim     SimInfo     `json:"sim"`
	NodeCVM NodeCVMInfo `json:"nodeCVM"`
	GPU     GPUInfo     `json:"gpu"`
}

// SNPUsable is true when SNP pod VMs can start here: SNP enabled, ASIDs
// known and non-zero, KVM not known to be unusable.
func (r Result) SNPUsable() bool {
	return r.SNP.Enabled && r.SNP.ASIDs.Known && r.SNP.ASIDs.Total > 0 && !r.KVM.knownUnusable()
}

// TDXUsable is true when TD pod VMs can start here.
func (r Result) TDXUsable() bool {
	return r.TDX.Enabled && r.TDX.Keys.Known && r.TDX.Keys.Total > 0 && !r.KVM.knownUnusable()
}

// SGXUsable is true when SGX enclaves can run here with some EPC.
func (r Result) SGXUsable() bool {
	return r.SGX.Enabled && r.SGX.EPCBytes.Known && r.SGX.EPCBytes.Total > 0
}

// Discover inspects the node as Options describe. It fails only when Root
// itself cannot be read; everything else missing is a finding, explained
// in the Reason fields.
func Discover(opts Options) (Result, error) {
	root := opts.Root
	if root == "" {
		root = "/"
	}
	st, err := os.Stat(root)
	if err != nil || !st.IsDir() {
		return Result{}, fmt.Errorf("discovery: root %q is not a readable directory: %v", root, err)
	}
	onHost := filepath.Clean(root) == "/"
	cpuid := opts.CPUID
	if cpuid == nil && onHost {
		cpuid = HostCPUID
	}
	sevFW := opts.SEVFirmware
	if sevFW == nil && onHost {
		sevFW = HostSEVFirmware
	}
	d := host{fsys: os.DirFS(root), root: root, cpuid: cpuid}
	capacity, capFile := readMisc(d.fsys, "misc.capacity")
	current, curFile := readMisc(d.fsys, "misc.current")
	m := misc{capacity: capacity, capFile: capFile, current: current, curFile: curFile}

	var r Result
	r.KVM = KVMInfo{Device: d.exists("dev/kvm"), Probe: opts.KVMProbe}
	r.SNP = d.snp(m, sevFW)
	r.TDX = d.tdx(m)
	r.SGX = d.sgx(m)
	r.Sim = d.sim(opts)
	r.GPU = d.gpus(opts.GPUCCModeFile)
	r.NodeCVM = NodeCVMInfo{
		SEVGuest:  d.exists("dev/sev-guest"),
		TDXGuest:  d.exists("dev/tdx_guest"),
		TSMReport: d.exists("sys/kernel/config/tsm/report"),
	}
	switch {
	case r.NodeCVM.SEVGuest:
		r.NodeCVM.TEE = SNP
	case r.NodeCVM.TDXGuest:
		r.NodeCVM.TEE = TDX
	}
	return r, nil
}

type host struct {
	fsys  fs.FS
	root  string
	cpuid CPUIDFunc
}

type misc struct {
	capacity, current miscTable
	capFile, curFile  string
}

// get returns resource name's capacity and usage from the misc cgroup.
func (m misc) get(name string) (Capacity, bool) {
	total, ok := m.capacity.get(name)
	if !ok {
		return Capacity{}, false
	}
	c := Capacity{Total: total, Known: true, Source: m.capFile + " " + name}
	if used, ok := m.current.get(name); ok {
		c.Used, c.UsedKnown = used, true
	}
	return c, true
}

func (d host) exists(path string) bool {
	_, err := fs.Stat(d.fsys, path)
	return err == nil
}

// boolParam reads a module parameter such as "Y", "N", "1" or "0".
func (d host) boolParam(path string) (on, present bool) {
	data, err := fs.ReadFile(d.fsys, path)
	if err != nil {
		return false, false
	}
	switch strings.TrimSpace(string(data)) {
	case "Y", "y", "1":
		return true, true
	}
	return false, true
}

func (d host) snp(m misc, firmware func(string) (string, error)) SNPInfo {
	var s SNPInfo
	const param = "sys/module/kvm_amd/parameters/sev_snp"
	on, present := d.boolParam(param)
	dev := d.exists("dev/sev")
	switch {
	case !present:
		s.Reason = "kvm_amd has no sev_snp parameter (/" + param + "): not an AMD host with SEV-SNP support, or kvm_amd is not loaded"
		return s
	case !on:
		s.Reason = "kvm_amd is loaded with SEV-SNP off (/" + param + " is N): enable SNP in the BIOS and load kvm_amd with sev_snp=1"
		return s
	case !dev:
		s.Reason = "kvm_amd has SEV-SNP on, but /dev/sev is missing: load the ccp driver"
		return s
	}
	s.Enabled = true
	s.Reason = "kvm_amd has SEV-SNP on and /dev/sev exists"
	if c, ok := m.get(MiscSEVES); ok {
		s.ASIDs = c
	} else if es, _, ok := sevASIDs(d.cpuid); ok {
		s.ASIDs = Capacity{Total: es, Known: true, Source: "CPUID 0x8000001F"}
	} else {
		s.Reason += "; the SEV-ES/SNP ASID count is unknown (no misc cgroup sev_es and no CPUID 0x8000001F)"
	}
	if c, ok := m.get(MiscSEV); ok {
		s.SEVASIDs = c
	} else if _, sev, ok := sevASIDs(d.cpuid); ok {
		s.SEVASIDs = Capacity{Total: sev, Known: true, Source: "CPUID 0x8000001F"}
	}
	if s.ASIDs.Known && s.ASIDs.Total == 0 {
		s.Reason += "; but no SEV-ES/SNP ASIDs are available (raise the BIOS setting for SEV-ES ASIDs)"
	}
	if firmware != nil {
		if v, err := firmware(filepath.Join(d.root, "dev/sev")); err == nil {
			s.Firmware = v
		}
	}
	return s
}

func (d host) tdx(m misc) TDXInfo {
	var t TDXInfo
	const param = "sys/module/kvm_intel/parameters/tdx"
	on, present := d.boolParam(param)
	switch {
	case !present:
		t.Reason = "kvm_intel has no tdx parameter (/" + param + "): not an Intel host with TDX support, or kvm_intel is not loaded"
		return t
	case !on:
		t.Reason = "kvm_intel is loaded with TDX off (/" + param + " is N): enable TDX in the BIOS and load kvm_intel with tdx=1"
		return t
	}
	t.Enabled = true
	t.Reason = "kvm_intel has TDX on"
	if c, ok := m.get(MiscTDX); ok {
		t.Keys = c
		if c.Total == 0 {
			t.Reason += "; but no TDX private keys are available"
		}
	} else {
		t.Reason += "; the TDX key count is unknown (no misc cgroup tdx resource: the kernel is too old)"
	}
	return t
}

func (d host) sgx(m misc) SGXInfo {
	var s SGXInfo
	if !d.exists("dev/sgx_enclave") {
		s.Reason = "/dev/sgx_enclave is missing: no SGX, or SGX is disabled in the BIOS"
		return s
	}
	s.Enabled = true
	s.Reason = "/dev/sgx_enclave exists"
	if c, ok := m.get(MiscSGXEPC); ok {
		s.EPCBytes = c
	} else if n, ok := sgxEPCBytes(d.cpuid); ok {
		s.EPCBytes = Capacity{Total: n, Known: true, Source: "CPUID 0x12"}
	} else {
		s.Reason += "; the EPC size is unknown (no misc cgroup sgx_epc and no CPUID 0x12 sections)"
	}
	return s
}

func (d host) sim(opts Options) SimInfo {
	switch {
	case opts.SimSlots < 0:
		return SimInfo{Reason: "sim is switched off in the configuration"}
	case opts.SimSlots > 0:
		return SimInfo{Slots: int64(opts.SimSlots), Reason: fmt.Sprintf("%d slots, as configured", opts.SimSlots)}
	}
	guest := opts.SimSlotMemoryMiB
	if guest <= 0 {
		guest = 512
	}
	totalMiB, err := d.memTotalMiB()
	if err != nil {
		return SimInfo{Reason: fmt.Sprintf("cannot size sim slots from host memory (%v): set the slot count in the configuration", err)}
	}
	per := int64(guest + DefaultSlotOverheadMiB)
	slots := (totalMiB - HostReserveMiB) / per
	if slots < 0 {
		slots = 0
	}
	return SimInfo{Slots: slots, Reason: fmt.Sprintf("%d slots from host memory: (%d MiB - %d MiB reserved) / (%d MiB guest + %d MiB overhead)",
		slots, totalMiB, HostReserveMiB, guest, DefaultSlotOverheadMiB)}
}

// memTotalMiB reads MemTotal from /proc/meminfo.
func (d host) memTotalMiB() (int64, error) {
	data, err := fs.ReadFile(d.fsys, "proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kib, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kib < 0 {
				return 0, fmt.Errorf("/proc/meminfo MemTotal %q is not a number", f[1])
			}
			return kib / 1024, nil
		}
	}
	return 0, errors.New("/proc/meminfo has no MemTotal line")
}
