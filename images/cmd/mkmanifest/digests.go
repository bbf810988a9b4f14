package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/c8s-dev/c8s/images/manifest"
	"github.com/c8s-dev/c8s/measurements/sim"
	"github.com/c8s-dev/c8s/measurements/snp"
	"github.com/c8s-dev/c8s/measurements/tdx"
)

// simVCPUType is the vCPU model of sim VMSAs (launcher/simtee.VCPUType).
const simVCPUType = "EPYC-v4"

// simDigests computes the sim launch digests of the image for each vCPU
// count in the comma-separated list.
func simDigests(firmware, kernel, initrd, cmdline, vcpus string) (manifest.SimDigests, error) {
	d := manifest.SimDigests{Cmdline: cmdline, VCPUType: simVCPUType, GuestFeatures: sim.DefaultFeatures, ByVCPUs: map[string]string{}}
	var counts []int
	for _, f := range strings.Split(vcpus, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return d, fmt.Errorf("-sim-vcpus: %q is not a vCPU count", f)
		}
		counts = append(counts, n)
	}
	fw, err := os.ReadFile(firmware)
	if err != nil {
		return d, fmt.Errorf("-sim-firmware: %w", err)
	}
	k, err := os.ReadFile(kernel)
	if err != nil {
		return d, err
	}
	i, err := os.ReadFile(initrd)
	if err != nil {
		return d, err
	}
	sig, err := snp.VCPUTypeSig(simVCPUType)
	if err != nil {
		return d, err
	}
	digests, err := sim.LaunchDigests(sim.Params{Firmware: fw, Kernel: snp.NewKernelHashes(k, i, cmdline), VCPUSig: sig}, counts)
	if err != nil {
		return d, err
	}
	sum := sha256.Sum256(fw)
	d.Firmware = manifest.FileDigest{Path: firmware, SHA256: hex.EncodeToString(sum[:])}
	for n, c := range counts {
		d.ByVCPUs[strconv.Itoa(c)] = digests[n].String()
	}
	return d, nil
}

// tdxDigests computes the MRTD of the TDVF at firmware.
func tdxDigests(firmware string) (manifest.TDXDigests, error) {
	fw, err := os.ReadFile(firmware)
	if err != nil {
		return manifest.TDXDigests{}, fmt.Errorf("-tdx-firmware: %w", err)
	}
	mrtd, err := tdx.FirmwareMRTD(fw, tdx.Options{})
	if err != nil {
		return manifest.TDXDigests{}, fmt.Errorf("-tdx-firmware %s: %w", firmware, err)
	}
	sum := sha256.Sum256(fw)
	return manifest.TDXDigests{
		Firmware: manifest.FileDigest{Path: firmware, SHA256: hex.EncodeToString(sum[:])},
		MRTD:     hex.EncodeToString(mrtd[:]),
	}, nil
}
