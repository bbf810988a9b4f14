package main

// The igvm subcommand: measure an IGVM file for SEV-SNP, or write the IGVM
// equivalent of an OVMF direct boot (--from-ovmf).

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/c8s-dev/c8s/measurements/igvm"
	"github.com/c8s-dev/c8s/measurements/snp"
)

func init() {
	register("igvm", "SEV-SNP launch digest of an IGVM file (checked against its ID block), or write one from OVMF with --from-ovmf", runIGVM)
}

const igvmUsage = `usage:
  c8s-measure igvm FILE [--vcpus N] [--vcpu-type T] [--loader qemu|igvmmeasure]
                        [--zero-pages native|normal] [--output-format hex|json]
  c8s-measure igvm --from-ovmf --ovmf F [--kernel K [--initrd I] [--append S]]
                   --vcpus N --vcpu-type T [--guest-features X] [--policy P]
                   -o OUT.igvm [--output-format hex|json]
`

func runIGVM(args []string, stdout, stderr io.Writer) error {
	for _, a := range args {
		if a == "--from-ovmf" || a == "-from-ovmf" {
			return runIGVMFromOVMF(args, stdout, stderr)
		}
	}
	return runIGVMMeasure(args, stdout, stderr)
}

func runIGVMMeasure(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("igvm", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), igvmUsage); fs.PrintDefaults() }
	vcpus := fs.Int("vcpus", 0, "vCPUs the guest starts with (default: one per VP context in the file); qemu loader only")
	vcpuType := fs.String("vcpu-type", "", "vCPU type of vCPUs without a VP context in the file (they start from the reset state): "+strings.Join(snp.VCPUTypes(), ", "))
	loaderName := fs.String("loader", "qemu", "whose measuring rules to follow: qemu (QEMU igvm-cfg with KVM) or igvmmeasure (coconut-svsm)")
	zero := fs.String("zero-pages", "native", "how PAGE_DATA without data is measured: native (SNP zero page, igvmmeasure --native-zero; what --from-ovmf files need) or normal (normal page of zeros, as QEMU's SEV backend launch-updates IGVM zero pages)")
	format := fs.String("output-format", "hex", "output format: hex or json")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("want exactly one IGVM FILE argument, got %d\n%s", len(pos), igvmUsage)
	}
	loader, err := igvm.ParseLoader(*loaderName)
	if err != nil {
		return fmt.Errorf("--loader: %v", err)
	}
	opt := igvm.MeasureOptions{Loader: loader, VCPUs: *vcpus}
	switch *zero {
	case "native":
	case "normal":
		opt.NormalZeroPages = true
	default:
		return fmt.Errorf("--zero-pages %q: want native or normal", *zero)
	}
	if *vcpus < 0 {
		return fmt.Errorf("--vcpus %d: want a positive count", *vcpus)
	}
	if *vcpuType != "" {
		sig, err := snp.VCPUTypeSig(*vcpuType)
		if err != nil {
			return fmt.Errorf("--vcpu-type: %v", err)
		}
		opt.ResetVCPUSig = uint64(sig)
	}
	if *format != "hex" && *format != "json" {
		return fmt.Errorf("--output-format %q: want hex or json", *format)
	}
	data, err := os.ReadFile(pos[0])
	if err != nil {
		return err
	}
	f, err := igvm.Parse(data)
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	m, err := igvm.SNPLaunchDigest(f, opt)
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	if err := igvmPrint(stdout, *format, loader, m, ""); err != nil {
		return err
	}
	for _, n := range m.Notes {
		fmt.Fprintf(stderr, "c8s-measure igvm: note: %s\n", n)
	}
	if err := m.CheckIDBlock(); err != nil {
		return fmt.Errorf("%s: %w; the guest would fail to launch with this ID block (check --vcpus, --loader and --zero-pages, or re-sign the file)", pos[0], err)
	}
	return nil
}

// igvmPrint prints a measurement to stdout as a hex digest or a JSON document.
func igvmPrint(stdout io.Writer, format string, loader igvm.Loader, m *igvm.Measurement, written string) error {
	if format == "hex" {
		_, err := fmt.Fprintln(stdout, m.Digest)
		return err
	}
	type vmsa struct {
		VCPU   int    `json:"vcpu"`
		Source string `json:"source"`
		GPA    string `json:"gpa"`
	}
	type idBlock struct {
		LD    string `json:"ld"`
		Match bool   `json:"match"`
	}
	doc := struct {
		Mode     string         `json:"mode"`
		File     string         `json:"file,omitempty"`
		Loader   string         `json:"loader"`
		Digest   string         `json:"digest"`
		Mask     string         `json:"compatibility_mask"`
		Policy   string         `json:"policy,omitempty"`
		VCPUs    int            `json:"vcpus"`
		VMSAs    []vmsa         `json:"vmsas"`
		Pages    map[string]int `json:"pages"`
		IDBlock  *idBlock       `json:"id_block,omitempty"`
		Notes    []string       `json:"notes,omitempty"`
		Platform string         `json:"platform"`
	}{Mode: "igvm", File: written, Loader: loader.String(), Digest: m.Digest.String(), Mask: fmt.Sprintf("%#x", m.Mask),
		VCPUs: len(m.VMSAs), Pages: map[string]int{}, Notes: m.Notes, Platform: "sev-snp"}
	if m.Policy != nil {
		doc.Policy = fmt.Sprintf("%#x", *m.Policy)
	}
	for _, v := range m.VMSAs {
		src := "reset-state"
		if v.FromFile {
			src = "file"
		}
		doc.VMSAs = append(doc.VMSAs, vmsa{VCPU: v.VCPU, Source: src, GPA: fmt.Sprintf("%#x", v.GPA)})
	}
	for t, n := range m.Pages {
		doc.Pages[t.String()] = n
	}
	if m.IDBlock != nil {
		doc.IDBlock = &idBlock{LD: hex.EncodeToString(m.IDBlock.LD[:]), Match: snp.Digest(m.IDBlock.LD) == m.Digest}
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}

func runIGVMFromOVMF(args []string, stdout, stderr io.Writer) error {
	f := newSevFlags("igvm", stdout, stderr).withKernel().withVCPUs().withSNP()
	var fromOVMF bool
	var out, policy string
	f.fs.BoolVar(&fromOVMF, "from-ovmf", false, "write the IGVM file of an OVMF (direct) boot")
	f.fs.StringVar(&out, "o", "", "output IGVM `PATH`")
	f.fs.StringVar(&policy, "policy", "", fmt.Sprintf("SEV-SNP guest policy (default %#x)", igvm.DefaultSNPPolicy))
	if err := f.parse(args); err != nil {
		return err
	}
	switch {
	case out == "":
		return errors.New("--from-ovmf needs -o OUT.igvm")
	case f.svsm != "" || f.varsSize != "" || f.varsFile != "" || f.snpOVMFHash != "":
		return errors.New("--svsm, --vars-size, --vars-file and --snp-ovmf-hash do not apply to --from-ovmf")
	case f.outputFormat == "base64":
		return errors.New("--output-format: want hex or json")
	}
	if f.kernel != "" {
		// QEMU's igvm-cfg launch of a c8s pod VM passes the SNP command line.
		noteTEEParam(stderr, "snp", f.appendLine)
	}
	counts, err := sevVCPUCounts(f.vcpus)
	if err != nil {
		return err
	}
	if len(counts) != 1 {
		return fmt.Errorf("--vcpus %q: an IGVM file is written for one vCPU count", f.vcpus)
	}
	vmm, err := f.vmm()
	if err != nil {
		return err
	}
	if vmm != snp.VMMQEMU {
		return fmt.Errorf("--from-ovmf writes a file for QEMU; --vmm-type %s is not supported", vmm)
	}
	sig, err := f.signature(vmm)
	if err != nil {
		return err
	}
	features, err := sevParseInt("guest-features", f.guestFeatures, 64)
	if err != nil {
		return err
	}
	boot := igvm.OVMFBoot{VCPUs: counts[0], VCPUSig: sig, GuestFeatures: features}
	if policy != "" {
		if boot.Policy, err = sevParseInt("policy", policy, 64); err != nil {
			return err
		}
	}
	in, err := f.load()
	if err != nil {
		return err
	}
	boot.Firmware, boot.Kernel = in.fw, in.kernel
	data, _, err := igvm.WriteOVMF(boot)
	if err != nil {
		return err
	}
	// Print the measurement of the bytes written (WriteOVMF has checked it
	// against the OVMF boot's digest).
	parsed, err := igvm.Parse(data)
	if err != nil {
		return err
	}
	m, err := igvm.SNPLaunchDigest(parsed, igvm.MeasureOptions{})
	if err != nil {
		return err
	}
	if err := igvmWriteFile(out, data); err != nil {
		return err
	}
	for _, n := range m.Notes {
		fmt.Fprintf(stderr, "c8s-measure igvm: note: %s\n", n)
	}
	return igvmPrint(stdout, f.outputFormat, igvm.LoaderQEMU, m, out)
}

// igvmWriteFile writes data to path through a temporary file and a rename,
// so a reader never sees a partial file.
func igvmWriteFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
