package snpext

import (
	"encoding/binary"
	"fmt"

	"github.com/c8s-dev/c8s/guest/api/kbs"
)

// AMD product lines, as AMD's KDS names them.
const (
	Milan = "Milan"
	Genoa = "Genoa"
	Turin = "Turin"
)

// HasFMC reports whether line's TCB_VERSION carries an FMC security patch
// level (Turin and later).
func HasFMC(line string) bool { return line == Turin }

// TCB is a TCB_VERSION decomposed in its product line's layout.
type TCB struct {
	// Line is the product line whose layout the value was read in.
	Line string
	// FMC is the FMC security patch level (Turin and later; 0 before).
	FMC        uint8
	Bootloader uint8
	TEE        uint8
	SNP        uint8
	Microcode  uint8
}

// DecomposeTCB reads raw (a report's TCB field as a little-endian uint64,
// as go-sev-guest's proto holds it) in line's layout.
func DecomposeTCB(raw uint64, line string) TCB {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], raw)
	v := kbs.SNPTCB(b[:], line)
	t := TCB{Line: line, Bootloader: v.Bootloader, TEE: v.TEE, SNP: v.SNP, Microcode: v.Microcode}
	if v.FMC != nil {
		t.FMC = *v.FMC
	}
	return t
}

// Raw composes t in its line's layout (reserved bytes zero).
func (t TCB) Raw() uint64 {
	var b [8]byte
	if HasFMC(t.Line) {
		b = [8]byte{t.FMC, t.Bootloader, t.TEE, t.SNP, 0, 0, 0, t.Microcode}
	} else {
		b = [8]byte{t.Bootloader, t.TEE, 0, 0, 0, 0, t.SNP, t.Microcode}
	}
	return binary.LittleEndian.Uint64(b[:])
}

// ReservedBits returns the bits of raw that line's layout reserves (must
// be zero).
func ReservedBits(raw uint64, line string) uint64 {
	if HasFMC(line) {
		return raw & 0x00ffffff00000000
	}
	return raw & 0x0000ffffffff0000
}

// AtLeast reports whether every component of t is at least min's.
func (t TCB) AtLeast(min TCB) bool {
	return t.FMC >= min.FMC && t.Bootloader >= min.Bootloader && t.TEE >= min.TEE &&
		t.SNP >= min.SNP && t.Microcode >= min.Microcode
}

// Equal reports whether t and u have the same components.
func (t TCB) Equal(u TCB) bool {
	return t.FMC == u.FMC && t.Bootloader == u.Bootloader && t.TEE == u.TEE && t.SNP == u.SNP && t.Microcode == u.Microcode
}

// Below names the components of t below min's ("snp 8 < 24"), for
// messages.
func (t TCB) Below(min TCB) string {
	var s string
	add := func(name string, got, want uint8) {
		if got < want {
			if s != "" {
				s += ", "
			}
			s += fmt.Sprintf("%s %d < %d", name, got, want)
		}
	}
	if HasFMC(t.Line) {
		add("fmc", t.FMC, min.FMC)
	}
	add("bl", t.Bootloader, min.Bootloader)
	add("tee", t.TEE, min.TEE)
	add("snp", t.SNP, min.SNP)
	add("ucode", t.Microcode, min.Microcode)
	return s
}

func (t TCB) String() string {
	s := fmt.Sprintf("bl=%d tee=%d snp=%d ucode=%d", t.Bootloader, t.TEE, t.SNP, t.Microcode)
	if HasFMC(t.Line) {
		s = fmt.Sprintf("fmc=%d ", t.FMC) + s
	}
	return s
}
