package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/c8s-dev/c8s/measurements/ovmf"
	"github.com/c8s-dev/c8s/measurements/snp"
)

func init() {
	register("snp", "SEV-SNP launch digest (OVMF, optional kernel/initrd/cmdline, or SNP+SVSM with --svsm)", runSNP)
	register("snp-ovmf-hash", "SEV-SNP OVMF-only hash, a seed for snp --snp-ovmf-hash", runSNPOVMFHash)
}

func runSNP(args []string, stdout, stderr io.Writer) error {
	f := newSevFlags("snp", stdout, stderr).withKernel().withVCPUs().withSNP()
	if err := f.parse(args); err != nil {
		return err
	}
	if f.kernel != "" {
		noteTEEParam(stderr, "snp", f.appendLine)
	}
	if f.svsm != "" || f.varsSize != "" || f.varsFile != "" {
		return runSVSM(f)
	}
	counts, vmm, sig, err := f.shape()
	if err != nil {
		return err
	}
	features, err := sevParseInt("guest-features", f.guestFeatures, 64)
	if err != nil {
		return err
	}
	p := snp.Params{VCPUSig: sig, VMM: vmm, GuestFeatures: features}
	if f.snpOVMFHash != "" {
		seed, err := snp.ParseDigest(f.snpOVMFHash)
		if err != nil {
			return fmt.Errorf("--snp-ovmf-hash: %v", err)
		}
		p.OVMFHash = &seed
	}
	// Measure the firmware's pages while the kernel and initrd are hashed.
	seed := func(fw *ovmf.Firmware) error {
		if p.OVMFHash != nil || f.kernel == "" {
			return nil
		}
		h, err := snp.OVMFHash(fw)
		p.OVMFHash = &h
		return err
	}
	in, err := f.load(seed)
	if err != nil {
		return err
	}
	p.Kernel = in.kernel
	digests, err := snp.LaunchDigestsSNP(in.fw, p, counts)
	if err != nil {
		return err
	}
	return f.print("snp", snpResults(counts, digests))
}

func snpResults(counts []int, digests []snp.Digest) []sevResult {
	out := make([]sevResult, len(counts))
	for i := range counts {
		out[i] = sevResult{VCPUs: counts[i], Digest: digests[i][:]}
	}
	return out
}

// runSVSM is snp with --svsm: OVMF plus a Coconut-SVSM image (QEMU only).
func runSVSM(f *sevFlags) error {
	switch {
	case f.svsm == "":
		return errors.New("--vars-size and --vars-file are for SNP+SVSM mode and need --svsm PATH")
	case f.varsSize != "" && f.varsFile != "":
		return errors.New("give only one of --vars-size and --vars-file")
	case f.varsSize == "" && f.varsFile == "":
		return errors.New("--svsm needs --vars-size or --vars-file (the OVMF_VARS size places the SVSM image below OVMF)")
	case f.kernel != "":
		return errors.New("--kernel is not measured in SNP+SVSM mode; drop it or drop --svsm")
	case f.snpOVMFHash != "":
		return errors.New("--snp-ovmf-hash is not supported in SNP+SVSM mode")
	}
	if f.isSet("guest-features") {
		if v, err := sevParseInt("guest-features", f.guestFeatures, 64); err != nil || v != snp.SVSMFeatures {
			return fmt.Errorf("--guest-features: SNP+SVSM mode always uses SEV_FEATURES %#x", snp.SVSMFeatures)
		}
	}
	counts, vmm, sig, err := f.shape()
	if err != nil {
		return err
	}
	if vmm != snp.VMMQEMU {
		return fmt.Errorf("SNP+SVSM mode is only defined for QEMU, not --vmm-type %s", vmm)
	}
	var vars uint64
	if f.varsFile != "" {
		st, err := os.Stat(f.varsFile)
		if err != nil {
			return err
		}
		vars = uint64(st.Size())
	} else if vars, err = sevParseInt("vars-size", f.varsSize, 64); err != nil {
		return err
	}
	in, err := f.load()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(f.svsm)
	if err != nil {
		return err
	}
	svsm, err := ovmf.Parse(data)
	if err != nil {
		return fmt.Errorf("%s: %w", f.svsm, err)
	}
	digests, err := snp.LaunchDigestsSVSM(in.fw, svsm, snp.SVSMParams{VCPUSig: sig, VarsSize: vars}, counts)
	if err != nil {
		return err
	}
	return f.print("snp:svsm", snpResults(counts, digests))
}

func runSNPOVMFHash(args []string, stdout, stderr io.Writer) error {
	f := newSevFlags("snp-ovmf-hash", stdout, stderr)
	if err := f.parse(args); err != nil {
		return err
	}
	in, err := f.load()
	if err != nil {
		return err
	}
	h, err := snp.OVMFHash(in.fw)
	if err != nil {
		return err
	}
	return f.print("snp:ovmf-hash", []sevResult{{Digest: h[:]}})
}
