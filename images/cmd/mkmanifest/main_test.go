package main

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/measurements/sim"
	"github.com/c8s-dev/c8s/measurements/snp"
	"github.com/c8s-dev/c8s/measurements/tdx"
)

func TestRunWritesVerifiableManifest(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"vmlinuz": "k", "initrd.img": "i"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{
		"-dir", dir, "-kernel-package", "linux-image-x", "-kernel-version", "1", "-kernel-release", "6.12.0-x",
		"-cmdline", "console=ttyS0", "-agent-sha256", strings.Repeat("0", 64), "-source-date-epoch", "42",
		"-package", "linux-image-x=1", "-package", "libc6=2.36-9",
	}
	if err := run(args); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Kernel.Release != "6.12.0-x" || m.SourceDateEpoch != 42 || m.Artifacts[manifest.RoleInitrd].Size != 1 ||
		len(m.Packages) != 2 || m.Packages[1] != (manifest.Package{Package: "libc6", Version: "2.36-9"}) {
		t.Errorf("manifest = %+v", m)
	}
}

func TestRunRequiresFlags(t *testing.T) {
	err := run([]string{"-dir", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "is required") {
		t.Errorf("run without metadata flags: %v", err)
	}
	if err := run([]string{"-package", "noversion"}); err == nil {
		t.Error("-package without a version was accepted")
	}
}

func TestSimDigestsAreRecordedPerShape(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string][]byte{"vmlinuz": []byte("kernel"), "initrd.img": []byte("initrd"), "bios.bin": make([]byte, 8192)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"-dir", dir, "-kernel-package", "linux-image-x", "-kernel-version", "1", "-kernel-release", "6.12",
		"-cmdline", "console=ttyS0", "-agent-sha256", strings.Repeat("ab", 32),
		"-sim-firmware", filepath.Join(dir, "bios.bin"), "-sim-vcpus", "1,4"}
	// The sim VM's command line names its TEE (c8s-launcher kernel-params
	// -tee sim): digests over a line that does not, or names another TEE,
	// would be of a VM the launcher never starts.
	for _, params := range [][]string{nil, {"-sim-params", "c8s.tee=snp"}, {"-sim-params", "c8s.tee=sim c8s.tee=sim"}} {
		if err := run(append(args, params...)); err == nil || !strings.Contains(err.Error(), "-sim-params") {
			t.Errorf("sim digests with %q: %v, want refused", params, err)
		}
	}
	if err := run(append(args, "-sim-params", "c8s.tee=sim")); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Load(filepath.Join(dir, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.Sim()
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := snp.VCPUTypeSig("EPYC-v4")
	want, err := sim.LaunchDigest(sim.Params{Firmware: make([]byte, 8192), Kernel: snp.NewKernelHashes([]byte("kernel"), []byte("initrd"), "console=ttyS0 c8s.tee=sim"), VCPUSig: sig}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.ByVCPUs) != 2 || d.ByVCPUs["4"] != want.String() || d.Cmdline != "console=ttyS0 c8s.tee=sim" || d.VCPUType != "EPYC-v4" || m.Cmdline != "console=ttyS0" {
		t.Fatalf("sim digests = %+v, want 4 vCPUs -> %s", d, want)
	}
}

func TestTDXMRTDIsRecorded(t *testing.T) {
	const ovmf = "/usr/share/ovmf/OVMF.fd" // Debian's ovmf package (make deps)
	// Any PE image stands in for the kernel (RTMR1 hashes its Authenticode
	// digest): systemd-boot's EFI stub (make deps).
	pe, err := os.ReadFile("/usr/lib/systemd/boot/efi/linuxx64.efi.stub")
	if err != nil {
		t.Fatalf("%v: run make deps (systemd-boot-efi)", err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"vmlinuz": pe, "initrd.img": []byte("initrd")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tdxFor := func(cmdline string) *manifest.TDXDigests {
		err := run([]string{"-dir", dir, "-kernel-package", "linux-image-x", "-kernel-version", "1", "-kernel-release", "6.12",
			"-cmdline", cmdline, "-agent-sha256", strings.Repeat("ab", 32), "-tdx-firmware", ovmf, "-tdx-params", "c8s.tee=tdx"})
		if err != nil {
			t.Fatal(err)
		}
		m, err := manifest.Load(filepath.Join(dir, manifest.FileName))
		if err != nil {
			t.Fatal(err)
		}
		d, err := m.TDX()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := tdxFor("console=ttyS0")
	// The command line (and with it a sealed image's root hash) is in RTMR2
	// only; the kernel in RTMR1.
	other := tdxFor("console=ttyS0 c8s.verity.roothash=00")
	if len(d.RTMR1) != 96 || len(d.RTMR2) != 96 || d.RTMRAssumptions == "" {
		t.Fatalf("RTMRs not recorded: %+v", d)
	}
	if other.RTMR1 != d.RTMR1 || other.RTMR2 == d.RTMR2 || other.MRTD != d.MRTD {
		t.Fatalf("a command line change must change RTMR2 only: %+v vs %+v", d, other)
	}
	// RTMR2 is predicted for the TDX VM's own command line.
	k, err := os.ReadFile(filepath.Join(dir, "vmlinuz"))
	if err != nil {
		t.Fatal(err)
	}
	rtmr2 := tdx.DirectBoot{Kernel: k, Initrd: []byte("initrd"), Cmdline: "console=ttyS0 c8s.tee=tdx"}.RTMR2()
	if d.Cmdline != "console=ttyS0 c8s.tee=tdx" || d.RTMR2 != hex.EncodeToString(rtmr2.Value[:]) {
		t.Fatalf("tdx digests for %q, RTMR2 %s; want them for \"console=ttyS0 c8s.tee=tdx\", %x", d.Cmdline, d.RTMR2, rtmr2.Value)
	}
	// The MRTD google/gce-tcb-verifier computes for this file (see
	// measurements/tdx's tests).
	const want = "4c7206f0f483c524f12c366c711e9049030a8d47c471ee5aa9c4999a08de4057fb887fed0744d5631a212967fb231c47"
	if d.MRTD != want || d.Firmware.Path != ovmf {
		t.Fatalf("tdx digests = %+v, want MRTD %s", d, want)
	}
	if err := run([]string{"-dir", dir, "-kernel-package", "x", "-kernel-version", "1", "-kernel-release", "6",
		"-cmdline", "c", "-agent-sha256", strings.Repeat("ab", 32), "-tdx-firmware", filepath.Join(dir, "vmlinuz"), "-tdx-params", "c8s.tee=tdx"}); err == nil {
		t.Fatal("a file without TDX metadata was accepted as TDVF")
	}
}
