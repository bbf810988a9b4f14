package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/measurements/igvm"
	"github.com/c8s-dev/c8s/measurements/ovmf"
	"github.com/c8s-dev/c8s/measurements/snp"
)

// The SNP digests, and the IGVM they are checked against, are of the SNP
// VM's own command line: the common one followed by c8s.tee=snp. An IGVM
// built over the common line alone (as before the TEE was fixed on the
// command line) measures differently and is refused.
func TestSNPDigestsAreOverTheSNPCmdline(t *testing.T) {
	raw, err := os.ReadFile("../../../testdata/snp/ovmf_AmdSev_suffix.bin")
	if err != nil {
		t.Fatal(err)
	}
	fw, err := ovmf.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := snp.VCPUTypeSig("EPYC-v4")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, data []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("vmlinuz", []byte("kernel"))
	write("initrd.img", []byte("initrd"))
	write("ovmf.fd", raw)
	writeIGVM := func(cmdline string) {
		t.Helper()
		hashes := snp.NewKernelHashes([]byte("kernel"), []byte("initrd"), cmdline)
		data, _, err := igvm.WriteOVMF(igvm.OVMFBoot{Firmware: fw, Kernel: &hashes, VCPUs: 1, VCPUSig: uint64(sig), GuestFeatures: 1})
		if err != nil {
			t.Fatal(err)
		}
		write("snp.igvm", data)
	}
	args := []string{"-dir", dir, "-kernel-package", "linux-image-x", "-kernel-version", "1", "-kernel-release", "6.12",
		"-cmdline", "console=ttyS0", "-agent-sha256", strings.Repeat("ab", 32),
		"-snp-firmware", filepath.Join(dir, "ovmf.fd"), "-snp-vcpus", "1,2", "-igvm", "snp.igvm"}

	writeIGVM("console=ttyS0 c8s.tee=snp")
	if err := run(args); err == nil || !strings.Contains(err.Error(), "-snp-params") {
		t.Fatalf("SNP digests without -snp-params: %v, want refused", err)
	}
	if err := run(append(args, "-snp-params", "c8s.tee=snp")); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Load(filepath.Join(dir, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.SNP()
	if err != nil {
		t.Fatal(err)
	}
	hashes := snp.NewKernelHashes([]byte("kernel"), []byte("initrd"), "console=ttyS0 c8s.tee=snp")
	want, err := snp.LaunchDigestSNP(fw, snp.Params{VCPUs: 2, VCPUSig: uint64(sig), VMM: snp.VMMQEMU, GuestFeatures: 1, Kernel: &hashes})
	if err != nil {
		t.Fatal(err)
	}
	if d.Cmdline != "console=ttyS0 c8s.tee=snp" || d.ByVCPUs["2"] != want.String() || d.IGVM != d.ByVCPUs["1"] || d.IGVMVCPUs != 1 || m.Cmdline != "console=ttyS0" {
		t.Fatalf("snp digests %+v (common cmdline %q); want them over \"console=ttyS0 c8s.tee=snp\", 2 vCPUs -> %s", d, m.Cmdline, want)
	}

	writeIGVM("console=ttyS0")
	if err := run(append(args, "-snp-params", "c8s.tee=snp")); err == nil || !strings.Contains(err.Error(), "measures") {
		t.Fatalf("an IGVM over the common command line: %v, want refused by the IGVM cross-check", err)
	}
}
