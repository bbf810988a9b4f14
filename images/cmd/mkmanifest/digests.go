package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/measurements/sim"
	"github.com/c8s-dev/c8s/measurements/snp"
	"github.com/c8s-dev/c8s/measurements/tdx"
)

// simVCPUType is the vCPU model of sim VMSAs (launcher/vm/tee/sim.VCPUType).
const simVCPUType = "EPYC-v4"

// teeCmdline returns the kernel command line a pod VM of tee boots, and its
// digests are computed over: the common command line followed by the
// TEE's own parameters (-<tee>-params, which `c8s-launcher kernel-params
// -tee <tee>` prints). They must name tee, and only once: the guest picks
// its attestation provider by that name.
func teeCmdline(common, tee, params string) (string, error) {
	params = strings.Join(strings.Fields(params), " ")
	cmdline := common
	if params != "" {
		cmdline += " " + params
	}
	got, ok, err := teeparam.FromCmdline(cmdline)
	if err != nil {
		return "", fmt.Errorf("-%s-params %q after -cmdline: %w", tee, params, err)
	}
	if !ok || got != tee {
		return "", fmt.Errorf("-%s-params %q: the %s digests must be over a command line that names the TEE (%s); pass `c8s-launcher kernel-params -tee %s`",
			tee, params, tee, teeparam.Format(tee), tee)
	}
	return cmdline, nil
}

// simDigests computes the sim launch digests of the image for each vCPU
// count in the comma-separated list.
func simDigests(firmware, kernel, initrd, cmdline, vcpus string) (manifest.SimDigests, error) {
	d := manifest.SimDigests{Cmdline: cmdline, VCPUType: simVCPUType, GuestFeatures: sim.DefaultFeatures, ByVCPUs: map[string]string{}}
	counts, err := parseCounts("-sim-vcpus", vcpus)
	if err != nil {
		return d, err
	}
	fw, err := os.ReadFile(firmware)
	if err != nil {
		return d, fmt.Errorf("-sim-firmware: %w", err)
	}
	hashes, sig, err := bootInputs(kernel, initrd, cmdline, simVCPUType)
	if err != nil {
		return d, err
	}
	digests, err := sim.LaunchDigests(sim.Params{Firmware: fw, Kernel: hashes, VCPUSig: sig}, counts)
	if err != nil {
		return d, err
	}
	sum := sha256.Sum256(fw)
	d.Firmware = manifest.FileDigest{Path: firmware, SHA256: hex.EncodeToString(sum[:])}
	for n, c := range counts {
		d.ByVCPUs[strconv.Itoa(c)] = digests[n].String()
	}
	// The sim TEE models a TD's measured boot only for an EFI-stub (PE)
	// kernel, as OVMF loads nothing else; test kernels need not be one.
	if k, err := os.ReadFile(kernel); err == nil && bytes.HasPrefix(k, []byte("MZ")) {
		if d.Boot, err = bootDigests(kernel, initrd, cmdline); err != nil {
			return d, err
		}
	}
	return d, nil
}

// bootDigests returns the measured-boot digests of a direct boot
// (measurements/tdx DirectBoot.Digests), which the TDX TEE's and the sim
// TEE's RTMR1 and RTMR2 record.
func bootDigests(kernel, initrd, cmdline string) (*manifest.BootDigests, error) {
	k, err := os.ReadFile(kernel)
	if err != nil {
		return nil, err
	}
	i, err := os.ReadFile(initrd)
	if err != nil {
		return nil, err
	}
	d, err := tdx.DirectBoot{Kernel: k, Initrd: i, Cmdline: cmdline}.Digests()
	if err != nil {
		return nil, fmt.Errorf("measured-boot digests: %w", err)
	}
	return &manifest.BootDigests{Kernel: hex.EncodeToString(d.Kernel), LoadOptions: hex.EncodeToString(d.LoadOptions), Initrd: hex.EncodeToString(d.Initrd)}, nil
}

// bootInputs hashes a direct boot's kernel, initrd and command line as QEMU
// does for its SEV hashes table, and resolves the vCPU type's signature.
func bootInputs(kernel, initrd, cmdline, vcpuType string) (snp.KernelHashes, uint32, error) {
	k, err := os.ReadFile(kernel)
	if err != nil {
		return snp.KernelHashes{}, 0, err
	}
	i, err := os.ReadFile(initrd)
	if err != nil {
		return snp.KernelHashes{}, 0, err
	}
	sig, err := snp.VCPUTypeSig(vcpuType)
	if err != nil {
		return snp.KernelHashes{}, 0, err
	}
	return snp.NewKernelHashes(k, i, cmdline), sig, nil
}

// parseCounts parses a comma-separated list of vCPU counts.
func parseCounts(flagName, list string) ([]int, error) {
	var counts []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: %q is not a vCPU count", flagName, f)
		}
		counts = append(counts, n)
	}
	return counts, nil
}

// rtmrAssumptions summarises measurements/tdx.DirectBoot's assumptions.
const rtmrAssumptions = "direct boot through OVMF/TDVF edk2-stable202505 or later with QEMU 10+: " +
	"RTMR1 = kernel Authenticode SHA-384 then the fixed boot-attempt and ExitBootServices events; " +
	"RTMR2 = the kernel EFI stub's load options (command line + \" initrd=initrd\", UTF-16LE) then the initrd (Linux 6.9+ stub); " +
	"the event shapes match a genuine OVMF direct-boot TD's CCEL (launcher/attest/testdata/tdx); RTMR0 is not predicted."

// tdxDigests computes the MRTD of the TDVF at firmware and predicts RTMR1
// and RTMR2 for a direct boot of kernel, initrd and cmdline (the TDX TEE's
// own, see teeCmdline).
func tdxDigests(firmware, kernel, initrd, cmdline string) (manifest.TDXDigests, error) {
	fw, err := os.ReadFile(firmware)
	if err != nil {
		return manifest.TDXDigests{}, fmt.Errorf("-tdx-firmware: %w", err)
	}
	mrtd, err := tdx.FirmwareMRTD(fw, tdx.Options{})
	if err != nil {
		return manifest.TDXDigests{}, fmt.Errorf("-tdx-firmware %s: %w", firmware, err)
	}
	k, err := os.ReadFile(kernel)
	if err != nil {
		return manifest.TDXDigests{}, err
	}
	i, err := os.ReadFile(initrd)
	if err != nil {
		return manifest.TDXDigests{}, err
	}
	boot := tdx.DirectBoot{Kernel: k, Initrd: i, Cmdline: cmdline}
	rtmr1, err := boot.RTMR1()
	if err != nil {
		return manifest.TDXDigests{}, fmt.Errorf("predict RTMR1: %w", err)
	}
	rtmr2 := boot.RTMR2()
	bd, err := bootDigests(kernel, initrd, cmdline)
	if err != nil {
		return manifest.TDXDigests{}, err
	}
	sum := sha256.Sum256(fw)
	return manifest.TDXDigests{
		Firmware:        manifest.FileDigest{Path: firmware, SHA256: hex.EncodeToString(sum[:])},
		Cmdline:         cmdline,
		MRTD:            hex.EncodeToString(mrtd[:]),
		RTMR1:           hex.EncodeToString(rtmr1.Value[:]),
		RTMR2:           hex.EncodeToString(rtmr2.Value[:]),
		RTMRAssumptions: rtmrAssumptions,
		Boot:            bd,
	}, nil
}
