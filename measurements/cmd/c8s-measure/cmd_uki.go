package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/c8s-dev/c8s/measurements/uki"
)

func init() {
	register("uki", "UKI Authenticode digests, systemd-stub section digests and predicted PCR 11 (after the stub and each boot phase)", runUKI)
}

type ukiSectionJSON struct {
	Name     string `json:"name"`
	Size     uint32 `json:"size"`
	Measured bool   `json:"measured"`
	SHA256   string `json:"sha256"`
	SHA384   string `json:"sha384"`
}

type ukiJSON struct {
	File               string            `json:"file"`
	StubVersion        int               `json:"stubVersion"`
	StubVersionSource  string            `json:"stubVersionSource"`
	StubInfo           string            `json:"stubInfo,omitempty"`
	AuthenticodeSHA256 string            `json:"authenticodeSHA256"`
	AuthenticodeSHA384 string            `json:"authenticodeSHA384"`
	Sections           []ukiSectionJSON  `json:"sections"`
	PCR11              map[string]string `json:"pcr11"`
	Phases             []ukiPhaseJSON    `json:"pcr11Phases"`
}

type ukiPhaseJSON struct {
	Phase string            `json:"phase"`
	PCR11 map[string]string `json:"pcr11"`
}

// parseInterleaved parses flags that may come before or after positional
// arguments (c8s-measure uki FILE --output-format json).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func runUKI(args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("uki", flag.ContinueOnError)
	format := fs.String("output-format", "text", "output format: text or json")
	stub := fs.Int("stub-version", 0, "systemd-stub major `VERSION` to assume (default: read from the UKI's .sdmagic section)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: c8s-measure uki FILE [--output-format text|json] [--stub-version N]")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) != 1:
		return errors.New("want exactly one UKI FILE (usage: c8s-measure uki FILE [--output-format text|json])")
	case *format != "text" && *format != "json":
		return fmt.Errorf("--output-format %q: want text or json", *format)
	case *stub < 0:
		return fmt.Errorf("--stub-version %d: want a positive systemd version", *stub)
	}
	img, err := os.ReadFile(pos[0])
	if err != nil {
		return err
	}
	r, err := uki.Measure(img, uki.Options{StubVersion: *stub})
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	out := ukiJSON{
		File: pos[0], StubVersion: r.StubVersion, StubVersionSource: r.StubVersionSource, StubInfo: r.StubInfo,
		AuthenticodeSHA256: hex.EncodeToString(r.AuthenticodeSHA256),
		AuthenticodeSHA384: hex.EncodeToString(r.AuthenticodeSHA384),
		Sections:           []ukiSectionJSON{},
		PCR11:              map[string]string{},
	}
	for _, s := range r.Sections {
		out.Sections = append(out.Sections, ukiSectionJSON{s.Name, s.Size, s.Measured,
			hex.EncodeToString(s.SHA256), hex.EncodeToString(s.SHA384)})
	}
	for _, b := range uki.Banks {
		out.PCR11[string(b)] = hex.EncodeToString(r.PCR11[b])
	}
	for _, p := range r.Phases {
		pj := ukiPhaseJSON{Phase: p.Phase, PCR11: map[string]string{}}
		for _, b := range uki.Banks {
			pj.PCR11[string(b)] = hex.EncodeToString(p.PCR11[b])
		}
		out.Phases = append(out.Phases, pj)
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	w := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintf(w, "file\t%s\n", out.File)
	fmt.Fprintf(w, "systemd-stub\t%d (from %s)\n", out.StubVersion, out.StubVersionSource)
	fmt.Fprintf(w, "authenticode sha256\t%s\n", out.AuthenticodeSHA256)
	fmt.Fprintf(w, "authenticode sha384\t%s\n", out.AuthenticodeSHA384)
	for _, s := range out.Sections {
		m := "not measured"
		if s.Measured {
			m = "measured"
		}
		fmt.Fprintf(w, "section %s\t%d bytes, %s\n", s.Name, s.Size, m)
		fmt.Fprintf(w, "  sha256\t%s\n", s.SHA256)
		fmt.Fprintf(w, "  sha384\t%s\n", s.SHA384)
	}
	for _, b := range uki.Banks {
		fmt.Fprintf(w, "pcr11 %s\t%s\n", b, out.PCR11[string(b)])
	}
	for _, p := range out.Phases {
		fmt.Fprintf(w, "pcr11 after %s\n", p.Phase)
		for _, b := range uki.Banks {
			fmt.Fprintf(w, "  %s\t%s\n", b, p.PCR11[string(b)])
		}
	}
	return w.Flush()
}
