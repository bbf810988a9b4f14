// Command pestamp makes a PE image's header reproducible: it sets the COFF
// TimeDateStamp, which objcopy fills with the current time, and recomputes
// the optional header's CheckSum over the result.
//
//	pestamp -epoch SOURCE_DATE_EPOCH FILE
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
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
	if len(b) < 0x40 || b[0] != 'M' || b[1] != 'Z' {
		return errors.New("not a PE image: no MZ header")
	}
	pe := int(binary.LittleEndian.Uint32(b[0x3c:]))
	if pe < 0 || pe+24+68 > len(b) || string(b[pe:pe+4]) != "PE\x00\x00" {
		return errors.New("not a PE image: no PE signature at e_lfanew")
	}
	binary.LittleEndian.PutUint32(b[pe+8:], epoch)
	sum := pe + 24 + 64 // CheckSum in the optional header (PE32 and PE32+)
	binary.LittleEndian.PutUint32(b[sum:], 0)
	binary.LittleEndian.PutUint32(b[sum:], checksum(b, sum))
	return nil
}

// checksum is the PE image checksum: the one's-complement style sum of the
// file's 16-bit little-endian words, with the CheckSum field taken as zero,
// folded to 16 bits, plus the file length.
func checksum(b []byte, field int) uint32 {
	var s uint64
	for i := 0; i+1 < len(b); i += 2 {
		if i == field || i == field+2 {
			continue
		}
		s += uint64(binary.LittleEndian.Uint16(b[i:]))
		s = (s & 0xffff) + (s >> 16)
	}
	if len(b)%2 == 1 {
		s += uint64(b[len(b)-1])
		s = (s & 0xffff) + (s >> 16)
	}
	s = (s & 0xffff) + (s >> 16)
	return uint32(s) + uint32(len(b))
}
