package discovery

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
)

// fakeCPU answers CPUID from a table; absent leaves read as zero, as on a
// CPU whose maximum leaf is below them.
type fakeCPU map[[2]uint32][4]uint32

func (f fakeCPU) cpuid(leaf, sub uint32) (uint32, uint32, uint32, uint32) {
	r := f[[2]uint32{leaf, sub}]
	return r[0], r[1], r[2], r[3]
}

// milan is an EPYC with SEV, SEV-ES and SNP, 509 encrypted ASIDs of which
// 1..99 are for SEV-ES/SNP (min SEV ASID 100).
var milan = fakeCPU{
	{0x80000000, 0}: {0x80000023, 0, 0, 0},
	{0x8000001F, 0}: {0x1b, 51, 509, 100},
}

func discover(t *testing.T, fixture string, opts Options) Result {
	t.Helper()
	opts.Root = filepath.Join("testdata", fixture)
	r, err := Discover(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSNPHost(t *testing.T) {
	var fwPath string
	r := discover(t, "snp-host", Options{SEVFirmware: func(dev string) (string, error) {
		fwPath = dev
		return "API 1.55 build 21", nil
	}})
	if !r.SNP.Enabled || !r.SNPUsable() {
		t.Fatalf("SNP not usable on the SNP host: %+v", r.SNP)
	}
	want := Capacity{Total: 99, Known: true, Used: 3, UsedKnown: true, Source: "/sys/fs/cgroup/misc.capacity sev_es"}
	if r.SNP.ASIDs != want {
		t.Fatalf("ASIDs = %+v, want %+v", r.SNP.ASIDs, want)
	}
	if r.SNP.ASIDs.Free() != 96 {
		t.Fatalf("free ASIDs = %d, want 96", r.SNP.ASIDs.Free())
	}
	if r.SNP.SEVASIDs.Total != 410 || r.SNP.SEVASIDs.Used != 0 || !r.SNP.SEVASIDs.UsedKnown {
		t.Fatalf("SEV ASIDs = %+v", r.SNP.SEVASIDs)
	}
	if r.SNP.Firmware != "API 1.55 build 21" || fwPath != filepath.Join("testdata", "snp-host", "dev", "sev") {
		t.Fatalf("firmware %q read from %q", r.SNP.Firmware, fwPath)
	}
	if r.TDX.Enabled || r.TDXUsable() || !strings.Contains(r.TDX.Reason, "kvm_intel has no tdx parameter") {
		t.Fatalf("TDX on an AMD host: %+v", r.TDX)
	}
	if r.SGX.Enabled || r.NodeCVM.TEE != "" || !r.KVM.Device {
		t.Fatalf("unexpected findings: %+v", r)
	}
	// 527958016 kB = 515584 MiB; (515584 - 1024) / (512 + 384) = 574.
	if r.Sim.Slots != 574 {
		t.Fatalf("sim slots = %d (%s), want 574", r.Sim.Slots, r.Sim.Reason)
	}
}

func TestHardwareTEEsNeedKVM(t *testing.T) {
	tcg := &accel.Result{Accel: accel.TCG, Reason: "probe timed out"}
	kvm := &accel.Result{Accel: accel.KVM, Reason: "probe booted"}
	if r := discover(t, "snp-host", Options{KVMProbe: tcg}); r.SNPUsable() || r.KVM.Usable() {
		t.Fatalf("SNP usable although the KVM probe chose TCG: %+v", r.KVM)
	}
	if r := discover(t, "snp-host", Options{KVMProbe: kvm}); !r.SNPUsable() || !r.KVM.Usable() {
		t.Fatalf("SNP not usable although the KVM probe chose KVM: %+v", r.KVM)
	}
	if r := discover(t, "tdx-host", Options{KVMProbe: tcg}); r.TDXUsable() {
		t.Fatal("TDX usable although the KVM probe chose TCG")
	}
	// No /dev/kvm at all: not usable even without a probe.
	r := discoverTree(t, map[string]string{
		"sys/module/kvm_amd/parameters/sev_snp": "Y\n",
		"dev/sev":                               "",
		"sys/fs/cgroup/misc.capacity":           "sev_es 10\n",
	}, Options{})
	if !r.SNP.Enabled || r.SNPUsable() {
		t.Fatalf("SNP without /dev/kvm: enabled %v usable %v", r.SNP.Enabled, r.SNPUsable())
	}
}

func TestSNPASIDsFromCPUIDWithoutMiscCgroup(t *testing.T) {
	r := discover(t, "snp-host-nomisc", Options{CPUID: milan.cpuid})
	if !r.SNPUsable() {
		t.Fatalf("SNP not usable: %+v", r.SNP)
	}
	if r.SNP.ASIDs != (Capacity{Total: 99, Known: true, Source: "CPUID 0x8000001F"}) {
		t.Fatalf("ASIDs = %+v", r.SNP.ASIDs)
	}
	if r.SNP.SEVASIDs.Total != 410 || r.SNP.ASIDs.Free() != 99 {
		t.Fatalf("SEV ASIDs = %+v, free ES/SNP = %d", r.SNP.SEVASIDs, r.SNP.ASIDs.Free())
	}
	// Without CPUID the count is unknown, and unknown capacity is not usable.
	r = discover(t, "snp-host-nomisc", Options{})
	if !r.SNP.Enabled || r.SNPUsable() || r.SNP.ASIDs.Known || !strings.Contains(r.SNP.Reason, "ASID count is unknown") {
		t.Fatalf("without misc or CPUID: %+v", r.SNP)
	}
	// A CPU that reports no SEV gives no count either.
	noSEV := fakeCPU{{0x80000000, 0}: {0x80000023, 0, 0, 0}}
	if r := discover(t, "snp-host-nomisc", Options{CPUID: noSEV.cpuid}); r.SNP.ASIDs.Known {
		t.Fatalf("ASIDs from a CPU without SEV: %+v", r.SNP.ASIDs)
	}
}

func TestSNPWithoutASIDsIsNotUsable(t *testing.T) {
	r := discoverTree(t, map[string]string{
		"sys/module/kvm_amd/parameters/sev_snp": "Y\n",
		"dev/sev":                               "",
		"dev/kvm":                               "",
		"sys/fs/cgroup/misc.capacity":           "sev 509\nsev_es 0\n",
	}, Options{})
	if !r.SNP.Enabled || r.SNPUsable() || !strings.Contains(r.SNP.Reason, "no SEV-ES/SNP ASIDs") {
		t.Fatalf("%+v", r.SNP)
	}
}

func TestSNPNeedsTheDevice(t *testing.T) {
	r := discoverTree(t, map[string]string{"sys/module/kvm_amd/parameters/sev_snp": "1\n"}, Options{})
	if r.SNP.Enabled || !strings.Contains(r.SNP.Reason, "/dev/sev is missing") {
		t.Fatalf("%+v", r.SNP)
	}
}

func TestTDXHost(t *testing.T) {
	r := discover(t, "tdx-host", Options{})
	if !r.TDX.Enabled || !r.TDXUsable() {
		t.Fatalf("TDX not usable on the TDX host: %+v", r.TDX)
	}
	if r.TDX.Keys != (Capacity{Total: 63, Known: true, Used: 2, UsedKnown: true, Source: "/sys/fs/cgroup/misc.capacity tdx"}) {
		t.Fatalf("keys = %+v", r.TDX.Keys)
	}
	if r.SNP.Enabled || !strings.Contains(r.SNP.Reason, "no sev_snp parameter") || r.SGX.Enabled {
		t.Fatalf("SNP/SGX on the TDX host: %+v %+v", r.SNP, r.SGX)
	}
}

func TestTDXKeysUnknownOnOldKernels(t *testing.T) {
	r := discoverTree(t, map[string]string{"sys/module/kvm_intel/parameters/tdx": "Y\n", "dev/kvm": ""}, Options{})
	if !r.TDX.Enabled || r.TDXUsable() || !strings.Contains(r.TDX.Reason, "key count is unknown") {
		t.Fatalf("%+v", r.TDX)
	}
}

func TestSGXHostWithCgroupV1Misc(t *testing.T) {
	r := discover(t, "sgx-host", Options{})
	if !r.SGXUsable() {
		t.Fatalf("SGX not usable: %+v", r.SGX)
	}
	if r.SGX.EPCBytes != (Capacity{Total: 68451041280, Known: true, Used: 0, UsedKnown: true, Source: "/sys/fs/cgroup/misc/misc.capacity sgx_epc"}) {
		t.Fatalf("EPC = %+v", r.SGX.EPCBytes)
	}
	if r.TDX.Enabled || !strings.Contains(r.TDX.Reason, "TDX off") {
		t.Fatalf("TDX: %+v", r.TDX)
	}
}

func TestSGXEPCFromCPUID(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "dev/sgx_enclave", "")
	cpu := fakeCPU{
		{0, 0}:    {0x20, 0, 0, 0},
		{7, 0}:    {0, 1 << 2, 0, 0},
		{0x12, 2}: {0x70200001, 0x0, 0x80000001, 0x1}, // 4 GiB + 2 GiB, flag bits in the low 12 bits
		{0x12, 3}: {0x00000001, 0x1, 0x40000000, 0x0}, // 1 GiB
		{0x12, 4}: {0, 0, 0, 0},
	}
	r, err := Discover(Options{Root: dir, CPUID: cpu.cpuid})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(7) << 30; r.SGX.EPCBytes.Total != want || r.SGX.EPCBytes.Source != "CPUID 0x12" || !r.SGXUsable() {
		t.Fatalf("EPC = %+v, want %d bytes from CPUID", r.SGX.EPCBytes, want)
	}
	// CPUID without the SGX feature bit: unknown.
	delete(cpu, [2]uint32{7, 0})
	r, _ = Discover(Options{Root: dir, CPUID: cpu.cpuid})
	if r.SGX.EPCBytes.Known || r.SGXUsable() {
		t.Fatalf("EPC from a CPU without SGX: %+v", r.SGX.EPCBytes)
	}
}

func TestPlainHost(t *testing.T) {
	r := discover(t, "plain-host", Options{})
	if r.SNPUsable() || r.TDXUsable() || r.SGXUsable() || r.NodeCVM.TEE != "" {
		t.Fatalf("TEE found on the plain host: %+v", r)
	}
	if !strings.Contains(r.SNP.Reason, "SEV-SNP off") {
		t.Fatalf("SNP reason: %s", r.SNP.Reason)
	}
	if !strings.Contains(r.SGX.Reason, "/dev/sgx_enclave is missing") {
		t.Fatalf("SGX reason: %s", r.SGX.Reason)
	}
	// 24589148 kB = 24012 MiB; (24012 - 1024) / 896 = 25.
	if r.Sim.Slots != 25 {
		t.Fatalf("sim slots = %d (%s)", r.Sim.Slots, r.Sim.Reason)
	}
}

func TestSimSlotsFromConfiguration(t *testing.T) {
	for _, tc := range []struct {
		slots, memory int
		want          int64
		reason        string
	}{
		{slots: 3, want: 3, reason: "as configured"},
		{slots: -1, want: 0, reason: "switched off"},
		// (24012 - 1024) / (2048 + 384) = 9.
		{slots: 0, memory: 2048, want: 9, reason: "from host memory"},
	} {
		r := discover(t, "plain-host", Options{SimSlots: tc.slots, SimSlotMemoryMiB: tc.memory})
		if r.Sim.Slots != tc.want || !strings.Contains(r.Sim.Reason, tc.reason) {
			t.Errorf("slots %d memory %d: got %+v, want %d (%s)", tc.slots, tc.memory, r.Sim, tc.want, tc.reason)
		}
	}
	// Auto without /proc/meminfo: none, and the reason says what to do.
	r, err := Discover(Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Sim.Slots != 0 || !strings.Contains(r.Sim.Reason, "set the slot count") {
		t.Fatalf("%+v", r.Sim)
	}
	// A tiny host gets zero slots, not a negative number.
	if r := discoverTree(t, map[string]string{"proc/meminfo": "MemTotal: 524288 kB\n"}, Options{}); r.Sim.Slots != 0 {
		t.Fatalf("512 MiB host: %+v", r.Sim)
	}
}

func TestNodeAsCVM(t *testing.T) {
	for fixture, want := range map[string]NodeCVMInfo{
		"snp-guest": {TEE: SNP, SEVGuest: true, TSMReport: true},
		"tdx-guest": {TEE: TDX, TDXGuest: true, TSMReport: true},
		"snp-host":  {},
		"tdx-host":  {},
	} {
		r := discover(t, fixture, Options{})
		if r.NodeCVM != want {
			t.Errorf("%s: node CVM = %+v, want %+v", fixture, r.NodeCVM, want)
		}
		if fixture == "snp-guest" && (r.SNPUsable() || r.KVM.Device) {
			t.Errorf("an SNP guest cannot launch SNP pod VMs: %+v", r)
		}
	}
}

func TestMissingRootIsAnError(t *testing.T) {
	_, err := Discover(Options{Root: filepath.Join(t.TempDir(), "nope")})
	if err == nil || !strings.Contains(err.Error(), "not a readable directory") {
		t.Fatalf("err = %v", err)
	}
}

func TestParseMiscSkipsMalformedLines(t *testing.T) {
	got := parseMisc([]byte("sev 10\nsev_es\nsgx_epc x\ntdx -1\n\ntdx 7 extra\nfoo 0\n"))
	if len(got) != 2 || got["sev"] != 10 || got["foo"] != 0 {
		t.Fatalf("%v", got)
	}
}

func TestDiscoverOnThisHost(t *testing.T) {
	r, err := Discover(Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, statErr := os.Stat("/dev/kvm")
	if r.KVM.Device != (statErr == nil) {
		t.Fatalf("KVM device %v, but stat /dev/kvm: %v", r.KVM.Device, statErr)
	}
	if r.Sim.Slots < 0 || r.Sim.Reason == "" || r.SNP.Reason == "" || r.TDX.Reason == "" || r.SGX.Reason == "" {
		t.Fatalf("incomplete result: %+v", r)
	}
}

func TestHostCPUIDReadsTheVendor(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		if HostCPUID != nil {
			t.Fatal("HostCPUID set on a non-x86 platform")
		}
		return
	}
	maxLeaf, b, c, d := HostCPUID(0, 0)
	vendor := string([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24),
		byte(d), byte(d >> 8), byte(d >> 16), byte(d >> 24),
		byte(c), byte(c >> 8), byte(c >> 16), byte(c >> 24)})
	// Every x86 CPU names its vendor in 12 printable ASCII characters
	// ("AuthenticAMD", "GenuineIntel", …) and has leaf 1.
	for _, ch := range vendor {
		if ch < 0x20 || ch > 0x7e {
			t.Fatalf("CPUID 0 vendor = %q", vendor)
		}
	}
	if maxLeaf < 1 {
		t.Fatalf("CPUID 0 max leaf = %d (vendor %q)", maxLeaf, vendor)
	}
	t.Logf("CPU vendor %q, max basic leaf %#x", vendor, maxLeaf)
}

// discoverTree runs Discover on a temporary root holding files.
func discoverTree(t *testing.T, files map[string]string, opts Options) Result {
	t.Helper()
	opts.Root = t.TempDir()
	for path, content := range files {
		write(t, opts.Root, path, content)
	}
	r, err := Discover(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func write(t *testing.T, root, path, content string) {
	t.Helper()
	p := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestConfigOptions(t *testing.T) {
	c, err := config.Parse([]byte("[hypervisor]\ndefault_memory = 1024\n[node]\nsim_slots = -1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if o := ConfigOptions(c); o.SimSlots != -1 || o.SimSlotMemoryMiB != 1024 {
		t.Fatalf("%+v", o)
	}
}
