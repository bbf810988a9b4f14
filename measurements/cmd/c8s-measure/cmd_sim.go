package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/c8s-dev/c8s/measurements/sim"
	"github.com/c8s-dev/c8s/measurements/snp"
)

func init() {
	register("sim", "launch digest of the sim TEE (firmware, kernel, initrd, cmdline, vCPUs; see measurements/sim)", runSim)
}

// runSim prints the digest the sim TEE's simulated secure processor puts in
// MEASUREMENT for a pod VM booted from these artefacts.
func runSim(args []string, stdout, stderr io.Writer) error {
	f := newSevFlags("sim", stdout, stderr).withKernel().withVCPUs()
	f.fs.StringVar(&f.ovmf, "firmware", "", "firmware `PATH` QEMU boots (-bios; SeaBIOS's bios-256k.bin by default)")
	f.fs.StringVar(&f.guestFeatures, "guest-features", "0x1", "VMSA SEV_FEATURES `VALUE`")
	if err := f.parse(args); err != nil {
		if f.ovmf == "" && f.fs.Parsed() {
			return errors.New("--firmware PATH is required (the -bios image the pod VM boots)")
		}
		return err
	}
	if f.kernel == "" {
		return errors.New("--kernel PATH is required: sim pod VMs boot their kernel directly")
	}
	noteTEEParam(stderr, "sim", f.appendLine)
	counts, _, sig, err := f.shape()
	if err != nil {
		return err
	}
	features, err := sevParseInt("guest-features", f.guestFeatures, 64)
	if err != nil {
		return err
	}
	fw, err := os.ReadFile(f.ovmf)
	if err != nil {
		return err
	}
	kHash, err := sevHashFile(f.kernel)
	if err != nil {
		return err
	}
	iHash := sha256.Sum256(nil)
	if f.initrd != "" {
		if iHash, err = sevHashFile(f.initrd); err != nil {
			return err
		}
	}
	digests, err := sim.LaunchDigests(sim.Params{
		Firmware: fw,
		Kernel:   snp.KernelHashes{Kernel: kHash, Initrd: iHash, Cmdline: snp.CmdlineHash(f.appendLine)},
		VCPUSig:  uint32(sig),
		Features: features,
	}, counts)
	if err != nil {
		return fmt.Errorf("%s: %w", f.ovmf, err)
	}
	return f.print("sim", snpResults(counts, digests))
}
