package main

// Flags, input loading and output shared by the AMD subcommands (snp,
// snp-ovmf-hash, sev, seves). Flag names follow virtee/sev-snp-measure.

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/c8s-dev/c8s/measurements/ovmf"
	"github.com/c8s-dev/c8s/measurements/snp"
)

// sevFlags are the flags of the AMD subcommands; each subcommand defines the
// subset it accepts. They also carry where the subcommand prints: results
// to stdout, warnings to stderr.
type sevFlags struct {
	fs             *flag.FlagSet
	stdout, stderr io.Writer

	ovmf, kernel, initrd, appendLine string
	vcpus                            string
	vcpuType, vcpuSig                string
	vcpuFamily, vcpuModel, vcpuStep  string
	vmmType                          string
	guestFeatures                    string
	snpOVMFHash                      string
	outputFormat                     string
	svsm, varsSize, varsFile         string
	verbose                          bool
}

// newSevFlags defines the flags common to every AMD mode; the with* methods
// add the rest. The subcommand prints its results to stdout and its
// warnings to stderr.
func newSevFlags(name string, stdout, stderr io.Writer) *sevFlags {
	f := &sevFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError), stdout: stdout, stderr: stderr}
	f.fs.StringVar(&f.ovmf, "ovmf", "", "OVMF firmware `PATH` (required)")
	f.fs.StringVar(&f.outputFormat, "output-format", "hex", "output format: hex, base64 or json")
	f.fs.BoolVar(&f.verbose, "verbose", false, "print the mode with the measurement")
	f.fs.BoolVar(&f.verbose, "v", false, "shorthand for --verbose")
	return f
}

func (f *sevFlags) withKernel() *sevFlags {
	f.fs.StringVar(&f.kernel, "kernel", "", "kernel `PATH` of a direct kernel boot")
	f.fs.StringVar(&f.initrd, "initrd", "", "initrd `PATH` (with --kernel)")
	f.fs.StringVar(&f.appendLine, "append", "", appendHelp)
	return f
}

func (f *sevFlags) withVCPUs() *sevFlags {
	f.fs.StringVar(&f.vcpus, "vcpus", "", "vCPU count, or a set such as 1,2,4,8 or 1-8 (one digest per count)")
	f.fs.StringVar(&f.vcpuType, "vcpu-type", "", "vCPU type: "+strings.Join(snp.VCPUTypes(), ", "))
	f.fs.StringVar(&f.vcpuSig, "vcpu-sig", "", "vCPU signature `VALUE` (CPUID 1 EAX)")
	f.fs.StringVar(&f.vcpuFamily, "vcpu-family", "", "vCPU family (with --vcpu-model and --vcpu-stepping)")
	f.fs.StringVar(&f.vcpuModel, "vcpu-model", "", "vCPU model")
	f.fs.StringVar(&f.vcpuStep, "vcpu-stepping", "", "vCPU stepping")
	f.fs.StringVar(&f.vmmType, "vmm-type", "QEMU", "VMM type: QEMU, ec2 or gce")
	return f
}

func (f *sevFlags) withSNP() *sevFlags {
	f.fs.StringVar(&f.guestFeatures, "guest-features", "0x1", "VMSA SEV_FEATURES `VALUE`")
	f.fs.StringVar(&f.snpOVMFHash, "snp-ovmf-hash", "", "precomputed OVMF-only `HASH` (hex, from snp-ovmf-hash) to use instead of the firmware's bytes")
	f.fs.StringVar(&f.svsm, "svsm", "", "Coconut-SVSM image `PATH` (SNP+SVSM mode; needs --vars-size or --vars-file)")
	f.fs.StringVar(&f.varsSize, "vars-size", "", "size in bytes of the OVMF_VARS file (SVSM mode)")
	f.fs.StringVar(&f.varsFile, "vars-file", "", "OVMF_VARS `PATH`, whose size is used (SVSM mode)")
	return f
}

// parse parses args and checks what every mode needs.
func (f *sevFlags) parse(args []string) error {
	if err := f.fs.Parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (all inputs are flags; see --help)", f.fs.Arg(0))
	}
	if f.ovmf == "" {
		return errors.New("--ovmf PATH is required")
	}
	switch f.outputFormat {
	case "hex", "base64", "json":
	default:
		return fmt.Errorf("--output-format %q: want hex, base64 or json", f.outputFormat)
	}
	if f.kernel == "" && (f.isSet("initrd") || f.isSet("append")) {
		return errors.New("--initrd and --append need --kernel")
	}
	return nil
}

// ignored warns about flags the reference tool accepts in this mode but
// that do not affect its measurement.
func (f *sevFlags) ignored(why string, names ...string) {
	for _, n := range names {
		if f.isSet(n) {
			fmt.Fprintf(f.stderr, "c8s-measure %s: ignoring --%s: %s\n", f.fs.Name(), n, why)
		}
	}
}

func (f *sevFlags) isSet(name string) bool {
	set := false
	f.fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}

// sevParseInt parses an integer the way Python's int(s, 0) does for the
// common cases: decimal, or 0x/0o/0b prefixed.
func sevParseInt(flagName, s string, bits int) (uint64, error) {
	v, err := strconv.ParseUint(strings.TrimSpace(s), 0, bits)
	if err != nil {
		return 0, fmt.Errorf("--%s %q: want a non-negative integer of at most %d bits (decimal or 0x-prefixed hex)", flagName, s, bits)
	}
	return v, nil
}

// sevVCPUCounts parses --vcpus: "4", "1,2,4,8", "1-8" or a mix ("1,2,4-8").
// The counts are returned in the order given, ranges expanded.
func sevVCPUCounts(s string) ([]int, error) {
	if s == "" {
		return nil, errors.New("--vcpus N is required")
	}
	const maxVCPUs = 1 << 16
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 1 || b < a || b > maxVCPUs {
			return nil, fmt.Errorf("--vcpus %q: %q is not a vCPU count or range (use e.g. 4, 1,2,4,8 or 1-8; counts 1..%d)", s, part, maxVCPUs)
		}
		for n := a; n <= b; n++ {
			out = append(out, n)
		}
	}
	return out, nil
}

// vmm returns the --vmm-type.
func (f *sevFlags) vmm() (snp.VMMType, error) {
	t, err := snp.ParseVMMType(f.vmmType)
	if err != nil {
		return 0, fmt.Errorf("--vmm-type: %v", err)
	}
	return t, nil
}

// signature returns the vCPU signature from --vcpu-family/model/stepping,
// --vcpu-sig or --vcpu-type (in that precedence, as the reference tool).
// QEMU needs one; EC2 and GCE ignore it.
func (f *sevFlags) signature(vmm snp.VMMType) (uint64, error) {
	switch {
	case f.vcpuFamily != "":
		if f.vcpuModel == "" || f.vcpuStep == "" {
			return 0, errors.New("--vcpu-family needs --vcpu-model and --vcpu-stepping")
		}
		fam, err := sevParseDecimal("vcpu-family", f.vcpuFamily)
		if err != nil {
			return 0, err
		}
		model, err := sevParseDecimal("vcpu-model", f.vcpuModel)
		if err != nil {
			return 0, err
		}
		step, err := sevParseDecimal("vcpu-stepping", f.vcpuStep)
		if err != nil {
			return 0, err
		}
		return uint64(snp.CPUSig(fam, model, step)), nil
	case f.vcpuSig != "":
		return sevParseInt("vcpu-sig", f.vcpuSig, 64)
	case f.vcpuType != "":
		sig, err := snp.VCPUTypeSig(f.vcpuType)
		if err != nil {
			return 0, fmt.Errorf("--vcpu-type: %v", err)
		}
		return uint64(sig), nil
	case vmm == snp.VMMQEMU:
		return 0, errors.New("missing --vcpu-type, --vcpu-sig or --vcpu-family (QEMU puts the vCPU signature in the VMSA); e.g. --vcpu-type EPYC-v4")
	}
	return 0, nil
}

// shape returns the vCPU counts, VMM type and vCPU signature.
func (f *sevFlags) shape() (counts []int, vmm snp.VMMType, sig uint64, err error) {
	if counts, err = sevVCPUCounts(f.vcpus); err != nil {
		return nil, 0, 0, err
	}
	if vmm, err = f.vmm(); err != nil {
		return nil, 0, 0, err
	}
	if sig, err = f.signature(vmm); err != nil {
		return nil, 0, 0, err
	}
	return counts, vmm, sig, nil
}

func sevParseDecimal(flagName, s string) (uint32, error) {
	v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("--%s %q: want a decimal number", flagName, s)
	}
	return uint32(v), nil
}

// amdInputs are the loaded firmware and kernel hashes.
type amdInputs struct {
	fw     *ovmf.Firmware
	kernel *snp.KernelHashes
}

// load reads the firmware and, with --kernel, hashes the kernel and initrd.
// The kernel and initrd are hashed on their own goroutines (through a
// read-only mapping, not copied into memory); meanwhile the firmware is
// read and parsed, and then whileHashing, if set, runs on it, so that work
// on the firmware overlaps the kernel hashes.
func (f *sevFlags) load(whileHashing ...func(*ovmf.Firmware) error) (amdInputs, error) {
	var (
		in           amdInputs
		kHash, iHash [sha256.Size]byte
		kErr, iErr   error
		wg           sync.WaitGroup
	)
	if f.kernel != "" {
		wg.Add(2)
		go func() { defer wg.Done(); kHash, kErr = sevHashFile(f.kernel) }()
		go func() {
			defer wg.Done()
			if f.initrd == "" {
				iHash = sha256.Sum256(nil)
				return
			}
			iHash, iErr = sevHashFile(f.initrd)
		}()
	}
	fw, fwErr := f.readFirmware()
	if fwErr == nil {
		for _, fn := range whileHashing {
			if fwErr = fn(fw); fwErr != nil {
				break
			}
		}
	}
	wg.Wait()
	if err := errors.Join(fwErr, kErr, iErr); err != nil {
		return in, err
	}
	in.fw = fw
	if f.kernel != "" {
		in.kernel = &snp.KernelHashes{Kernel: kHash, Initrd: iHash, Cmdline: snp.CmdlineHash(f.appendLine)}
	}
	return in, nil
}

func (f *sevFlags) readFirmware() (*ovmf.Firmware, error) {
	data, err := os.ReadFile(f.ovmf)
	if err != nil {
		return nil, err
	}
	fw, err := ovmf.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.ovmf, err)
	}
	return fw, nil
}

// sevHashStream hashes r (the file at path) with 1 MiB reads.
func sevHashStream(r io.Reader, path string) ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	h := sha256.New()
	buf := make([]byte, 1<<20)
	if _, err := io.CopyBuffer(h, struct{ io.Reader }{r}, buf); err != nil {
		return d, fmt.Errorf("reading %s: %w", path, err)
	}
	h.Sum(d[:0])
	return d, nil
}

// sevResult is one digest for one vCPU count (0 when the mode has none).
type sevResult struct {
	VCPUs  int
	Digest []byte
}

// sevModeName is the name the reference tool prints with --verbose for mode.
func sevModeName(mode string) string {
	switch mode {
	case "snp":
		return "SEV_SNP"
	case "snp:svsm":
		return "SEV_SNP_SVSM"
	case "sev":
		return "SEV"
	case "seves":
		return "SEV_ES"
	case "snp:ovmf-hash":
		return "SNP OVMF hash"
	}
	return ""
}

// print writes the results: the digest alone for one result, a "vcpus
// digest" table for several (sorted by vCPU count, duplicates dropped), or
// a JSON document.
func (f *sevFlags) print(mode string, results []sevResult) error {
	enc := func(b []byte) string {
		if f.outputFormat == "base64" {
			return base64.StdEncoding.EncodeToString(b)
		}
		return hex.EncodeToString(b)
	}
	if len(results) > 1 {
		results = append([]sevResult(nil), results...)
		sort.SliceStable(results, func(i, j int) bool { return results[i].VCPUs < results[j].VCPUs })
		uniq := results[:1]
		for _, r := range results[1:] {
			if r.VCPUs != uniq[len(uniq)-1].VCPUs {
				uniq = append(uniq, r)
			}
		}
		results = uniq
	}
	if f.outputFormat == "json" {
		type entry struct {
			VCPUs  int    `json:"vcpus,omitempty"`
			Digest string `json:"digest"`
		}
		doc := struct {
			Mode         string  `json:"mode"`
			Measurements []entry `json:"measurements"`
		}{Mode: mode}
		for _, r := range results {
			doc.Measurements = append(doc.Measurements, entry{VCPUs: r.VCPUs, Digest: enc(r.Digest)})
		}
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(f.stdout, "%s\n", b)
		return err
	}
	if len(results) == 1 {
		m := enc(results[0].Digest)
		if f.verbose {
			_, err := fmt.Fprintf(f.stdout, "Calculated %s guest measurement: %s\n", sevModeName(mode), m)
			return err
		}
		_, err := fmt.Fprintln(f.stdout, m)
		return err
	}
	if _, err := fmt.Fprintf(f.stdout, "%-6s %s\n", "VCPUS", "DIGEST"); err != nil {
		return err
	}
	for _, r := range results {
		if _, err := fmt.Fprintf(f.stdout, "%-6d %s\n", r.VCPUs, enc(r.Digest)); err != nil {
			return err
		}
	}
	return nil
}
