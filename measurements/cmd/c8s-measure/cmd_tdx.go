package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/c8s-dev/c8s/measurements/tdx"
)

func init() {
	register("tdx", "TDX MRTD of a TDVF/OVMF image; with json output also RTMR1/RTMR2 of a direct kernel boot", runTDX)
}

// rtmr0Note explains why RTMR0 is never predicted.
const rtmr0Note = "RTMR0 is not predicted: it measures the TD HOB (guest memory size and layout) and QEMU's ACPI tables (every device of the machine), which are not inputs here; take it from a reference boot of the same machine shape"

type tdxEventJSON struct {
	Description string `json:"description"`
	Digest      string `json:"digest"`
}

type tdxRegisterJSON struct {
	Value  string         `json:"value"`
	Events []tdxEventJSON `json:"events"`
}

type tdxSectionJSON struct {
	Type           string `json:"type"`
	DataOffset     uint32 `json:"dataOffset"`
	RawDataSize    uint32 `json:"rawDataSize"`
	MemoryAddress  string `json:"memoryAddress"`
	MemoryDataSize uint64 `json:"memoryDataSize"`
	MRExtend       bool   `json:"mrExtend"`
	PageAug        bool   `json:"pageAug"`
}

type tdxJSON struct {
	MRTD        string           `json:"mrtd"`
	Ordering    string           `json:"ordering"`
	RTMR0       *tdxRegisterJSON `json:"rtmr0"`
	RTMR0Note   string           `json:"rtmr0Note"`
	RTMR1       *tdxRegisterJSON `json:"rtmr1,omitempty"`
	RTMR2       *tdxRegisterJSON `json:"rtmr2,omitempty"`
	Assumptions []string         `json:"assumptions"`
	Sections    []tdxSectionJSON `json:"tdvfSections"`
}

func registerJSON(r tdx.Register) *tdxRegisterJSON {
	out := &tdxRegisterJSON{Value: hex.EncodeToString(r.Value[:]), Events: []tdxEventJSON{}}
	for _, e := range r.Events {
		out.Events = append(out.Events, tdxEventJSON{e.Description, hex.EncodeToString(e.Digest)})
	}
	return out
}

// directBootAssumptions summarises tdx.DirectBoot's documentation.
func directBootAssumptions() []string {
	return []string{
		"direct boot (QEMU -kernel) with OVMF/TDVF from edk2-stable202505 on and QEMU 10 or later: the kernel is measured unmodified, older pairs measure a QEMU-patched setup header",
		"RTMR1 = kernel Authenticode SHA-384, \"Calling EFI Application from Boot Option\", separator, \"Exit Boot Services Invocation\", \"Exit Boot Services Returned with Success\"",
		"RTMR2 = load options (cmdline plus \" initrd=initrd\" with an initrd, UTF-16LE with NUL) then the initrd, both measured by the kernel's EFI stub through EFI_CC_MEASUREMENT_PROTOCOL (Linux 6.9 or later); older kernels leave RTMR2 without them",
		"not validated against a TD on this machine (no TDX hardware); compare with the guest's CCEL event log",
	}
}

func runTDX(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tdx", flag.ContinueOnError)
	fw := fs.String("ovmf", "", "TDVF/OVMF firmware `PATH` (required)")
	twoPass := fs.Bool("two-pass", false, "use the QEMU 8.x TDX patches' ordering: per section all PAGE.ADDs, then all MR.EXTENDs")
	skipAug := fs.Bool("skip-page-aug", false, "leave PAGE.AUG sections out of MRTD (TDVF design guide, virtee/tdx-measure); upstream QEMU adds them")
	kernel := fs.String("kernel", "", "kernel `PATH` of a direct boot (json output predicts RTMR1/RTMR2)")
	initrd := fs.String("initrd", "", "initrd `PATH` (with --kernel)")
	appendLine := fs.String("append", "", appendHelp)
	format := fs.String("output-format", "hex", "output format: hex (MRTD only) or json (every register it can predict, with assumptions)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q (all inputs are flags; see --help)", fs.Arg(0))
	case *fw == "":
		return errors.New("--ovmf PATH is required")
	case *format != "hex" && *format != "json":
		return fmt.Errorf("--output-format %q: want hex or json", *format)
	case *kernel == "" && (*initrd != "" || isFlagSet(fs, "append")):
		return errors.New("--initrd and --append need --kernel")
	}
	opts := tdx.Options{SkipPageAug: *skipAug}
	if *twoPass {
		opts.Ordering = tdx.TwoPass
	}
	image, err := os.ReadFile(*fw)
	if err != nil {
		return err
	}
	md, err := tdx.Parse(image)
	if err != nil {
		return fmt.Errorf("%s: %w", *fw, err)
	}
	mrtd, err := tdx.MRTD(image, md, opts)
	if err != nil {
		return fmt.Errorf("%s: %w", *fw, err)
	}
	if *format == "hex" {
		_, err := fmt.Fprintln(stdout, hex.EncodeToString(mrtd[:]))
		return err
	}

	out := tdxJSON{
		MRTD:        hex.EncodeToString(mrtd[:]),
		Ordering:    opts.Ordering.String(),
		RTMR0Note:   rtmr0Note,
		Assumptions: []string{mrtdAssumption(opts)},
	}
	for _, s := range md.Sections {
		out.Sections = append(out.Sections, tdxSectionJSON{
			Type: s.Type.String(), DataOffset: s.DataOffset, RawDataSize: s.RawDataSize,
			MemoryAddress: fmt.Sprintf("%#x", s.MemoryAddress), MemoryDataSize: s.MemoryDataSize,
			MRExtend: s.Attributes&tdx.AttrMRExtend != 0, PageAug: s.Attributes&tdx.AttrPageAug != 0,
		})
	}
	if *kernel != "" {
		noteTEEParam(stderr, "tdx", *appendLine)
		b := tdx.DirectBoot{Cmdline: *appendLine}
		if b.Kernel, err = os.ReadFile(*kernel); err != nil {
			return err
		}
		if *initrd != "" {
			if b.Initrd, err = os.ReadFile(*initrd); err != nil {
				return err
			}
		}
		r1, err := b.RTMR1()
		if err != nil {
			return fmt.Errorf("%s: %w", *kernel, err)
		}
		out.RTMR1, out.RTMR2 = registerJSON(r1), registerJSON(b.RTMR2())
		out.Assumptions = append(out.Assumptions, directBootAssumptions()...)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func mrtdAssumption(o tdx.Options) string {
	aug := "PAGE.AUG sections added like the others (upstream QEMU)"
	if o.SkipPageAug {
		aug = "PAGE.AUG sections left out"
	}
	return "MRTD: " + o.Ordering.String() + " ordering of PAGE.ADD and MR.EXTEND; " + aug
}

func isFlagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
