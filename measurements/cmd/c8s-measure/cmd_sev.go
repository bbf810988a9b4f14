package main

import (
	"io"

	"github.com/c8s-dev/c8s/measurements/snp"
)

func init() {
	register("sev", "SEV launch digest (OVMF, optional kernel/initrd/cmdline)", runSEV)
	register("seves", "SEV-ES launch digest (OVMF, optional kernel/initrd/cmdline, VMSAs)", runSEVES)
}

func runSEV(args []string, stdout, stderr io.Writer) error {
	f := newSevFlags("sev", stdout, stderr).withKernel().withVCPUs()
	if err := f.parse(args); err != nil {
		return err
	}
	f.ignored("an SEV launch digest covers no vCPU state", "vcpus", "vcpu-type", "vcpu-sig", "vcpu-family", "vcpu-model", "vcpu-stepping", "vmm-type")
	in, err := f.load()
	if err != nil {
		return err
	}
	d, err := snp.LaunchDigestSEV(in.fw, in.kernel)
	if err != nil {
		return err
	}
	return f.print("sev", []sevResult{{Digest: d[:]}})
}

func runSEVES(args []string, stdout, stderr io.Writer) error {
	f := newSevFlags("seves", stdout, stderr).withKernel().withVCPUs()
	f.fs.StringVar(&f.guestFeatures, "guest-features", "", "accepted for compatibility; SEV-ES VMSAs have SEV_FEATURES 0")
	if err := f.parse(args); err != nil {
		return err
	}
	f.ignored("SEV-ES VMSAs are measured with SEV_FEATURES 0", "guest-features")
	counts, vmm, sig, err := f.shape()
	if err != nil {
		return err
	}
	in, err := f.load()
	if err != nil {
		return err
	}
	digests, err := snp.LaunchDigestsSEVES(in.fw, snp.SEVESParams{VCPUSig: sig, VMM: vmm, Kernel: in.kernel}, counts)
	if err != nil {
		return err
	}
	out := make([]sevResult, len(counts))
	for i := range counts {
		out[i] = sevResult{VCPUs: counts[i], Digest: digests[i][:]}
	}
	return f.print("seves", out)
}
