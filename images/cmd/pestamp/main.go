// Command pestamp makes a PE image's header reproducible: it sets the COFF
// TimeDateStamp, which objcopy fills with the current time, and recomputes
// the optional header's CheckSum over the result. The image is parsed by
// measurements/uki/pecoff, the PE parser the UKI measurement uses.
//
//	pestamp -epoch SOURCE_DATE_EPOCH FILE
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/c8s-dev/c8s/measurements/uki/pecoff"
)

func main() {
	epoch := flag.Uint64("epoch", 0, "timestamp to write (SOURCE_DATE_EPOCH)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: pestamp -epoch N FILE")
		os.Exit(2)
	}
	if err := stamp(flag.Arg(0), uint32(*epoch)); err != nil {
		fmt.Fprintln(os.Stderr, "pestamp:", err)
		os.Exit(1)
	}
}

func stamp(path string, epoch uint32) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := setStamp(b, epoch); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, b, 0o644)
}

// setStamp rewrites TimeDateStamp and CheckSum of the PE image b in place.
func setStamp(b []byte, epoch uint32) error {
	f, err := pecoff.Parse(b)
	if err != nil {
		return err
	}
	f.SetTimeDateStamp(epoch)
	return nil
}
