// Package tdx precomputes the measurement registers of an Intel TDX trust
// domain booted by QEMU with TDVF (OVMF built with TDX support).
//
// # MRTD
//
// The TDX module measures the initial contents of the TD into MRTD, one
// SHA-384 stream over 128-byte records. The VMM walks the sections of the
// firmware's TDVF metadata in order and, for each 4 KiB page:
//
//   - TDH.MEM.PAGE.ADD extends a record holding "MEM.PAGE.ADD" at byte 0 and
//     the page's guest-physical address (little-endian) at byte 16;
//   - if the section has the MR.EXTEND attribute, TDH.MR.EXTEND then
//     measures the page in sixteen 256-byte chunks, each as a record holding
//     "MR.EXTEND" and the chunk's GPA, followed by the 256 bytes.
//
// Section contents are the raw data from the firmware file, zero-filled to
// the section's memory size. This is what upstream QEMU and KVM do: every
// section is added and, if marked, extended, page by page
// (KVM_TDX_INIT_MEM_REGION), whatever its PAGE.AUG attribute. The QEMU 8.x
// TDX patch series instead added all pages of a section before extending
// any of them (Options.Ordering), and the TDVF design guide means PAGE.AUG
// sections to be left out of the measurement (Options.SkipPageAug).
//
// # RTMRs
//
// RTMR0 holds the TD HOB, the configuration firmware volume, the Secure
// Boot variables, QEMU's ACPI tables and the boot variables. The TD HOB
// depends on the guest memory size and layout and the ACPI tables on every
// device of the machine, so RTMR0 is not predicted here: take it from a
// reference boot of the same machine shape, or from a tool that replays
// QEMU's table generation.
//
// RTMR1 and RTMR2 are predicted for a direct boot (QEMU -kernel) under the
// conventions of DirectBoot; see its documentation for the assumptions.
//
// The package is pure: it takes the firmware and payload bytes and never
// reads files or panics on malformed input.
package tdx

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/c8s-dev/c8s/measurements/ovmf"
)

const (
	pageSize        = 0x1000
	descriptorSize  = 16
	sectionDescSize = 32
	// maxSections bounds the section count taken from the descriptor.
	maxSections = 1024
)

// SectionType is the type of a TDVF metadata section.
type SectionType uint32

// Section types of the TDVF design guide.
const (
	SectionBFV          SectionType = 0
	SectionCFV          SectionType = 1
	SectionTDHOB        SectionType = 2
	SectionTempMem      SectionType = 3
	SectionPermMem      SectionType = 4
	SectionPayload      SectionType = 5
	SectionPayloadParam SectionType = 6
	SectionTDInfo       SectionType = 7
)

// String returns the design guide's name of the section type.
func (t SectionType) String() string {
	switch t {
	case SectionBFV:
		return "BFV"
	case SectionCFV:
		return "CFV"
	case SectionTDHOB:
		return "TD_HOB"
	case SectionTempMem:
		return "TempMem"
	case SectionPermMem:
		return "PermMem"
	case SectionPayload:
		return "Payload"
	case SectionPayloadParam:
		return "PayloadParam"
	case SectionTDInfo:
		return "TD_INFO"
	}
	return fmt.Sprintf("unknown(%d)", uint32(t))
}

// Section attributes.
const (
	// AttrMRExtend asks the VMM to measure the section's contents with
	// TDH.MR.EXTEND.
	AttrMRExtend uint32 = 1 << 0
	// AttrPageAug marks a section the VMM adds after the TD starts, with
	// TDH.MEM.PAGE.AUG, outside the measurement.
	AttrPageAug uint32 = 1 << 1
)

// Section is one TDVF metadata section descriptor.
type Section struct {
	DataOffset     uint32
	RawDataSize    uint32
	MemoryAddress  uint64
	MemoryDataSize uint64
	Type           SectionType
	Attributes     uint32
}

// Metadata is a parsed TDVF metadata descriptor.
type Metadata struct {
	// Offset is the descriptor's offset from the start of the firmware.
	Offset   int
	Version  uint32
	Sections []Section
}

// ErrNoTDXMetadata is wrapped by Parse when the firmware has no TDX
// metadata offset entry in its footer table.
var ErrNoTDXMetadata = errors.New("tdx: firmware has no TDX metadata (footer table entry e47a6535-984a-4798-865e-4685a7bf8ec2); is it an OVMF/TDVF build with TDX support?")

// Parse locates and parses the TDVF metadata of the firmware image fw
// through its OVMF footer table.
func Parse(fw []byte) (*Metadata, error) {
	f, err := ovmf.Parse(fw)
	if err != nil {
		return nil, fmt.Errorf("tdx: %w", err)
	}
	entry, ok := f.TableEntry(ovmf.TDXMetadataOffsetGUID)
	if !ok {
		return nil, ErrNoTDXMetadata
	}
	return ParseMetadata(fw, entry)
}

// ParseMetadata parses the TDVF metadata of fw given the payload of its
// TDX metadata offset footer entry: a little-endian uint32, the distance of
// the "TDVF" descriptor from the end of the image.
func ParseMetadata(fw []byte, offsetEntry []byte) (*Metadata, error) {
	if len(offsetEntry) < 4 {
		return nil, fmt.Errorf("tdx: TDX metadata offset entry is %d bytes, want 4", len(offsetEntry))
	}
	n := int64(len(fw))
	fromEnd := int64(binary.LittleEndian.Uint32(offsetEntry))
	if fromEnd < descriptorSize || fromEnd > n {
		return nil, fmt.Errorf("tdx: TDX metadata offset %#x from the end lies outside the %d-byte firmware", fromEnd, n)
	}
	start := n - fromEnd
	d := fw[start:]
	if string(d[:4]) != "TDVF" {
		return nil, fmt.Errorf("tdx: no TDVF descriptor at offset %#x (found %q); the firmware's TDX metadata offset is wrong or the image is truncated", start, d[:4])
	}
	length := int64(binary.LittleEndian.Uint32(d[4:]))
	md := &Metadata{Offset: int(start), Version: binary.LittleEndian.Uint32(d[8:])}
	count := int64(binary.LittleEndian.Uint32(d[12:]))
	if md.Version != 1 {
		return nil, fmt.Errorf("tdx: TDVF metadata version %d is not supported (want 1)", md.Version)
	}
	if count == 0 || count > maxSections {
		return nil, fmt.Errorf("tdx: TDVF metadata declares %d sections (want 1 to %d)", count, maxSections)
	}
	need := descriptorSize + count*sectionDescSize
	if length < need {
		return nil, fmt.Errorf("tdx: TDVF descriptor length %d is too small for its %d sections (needs %d)", length, count, need)
	}
	if start+need > n {
		return nil, fmt.Errorf("tdx: TDVF metadata with %d sections at offset %#x runs past the end of the %d-byte firmware", count, start, n)
	}
	for i := int64(0); i < count; i++ {
		b := d[descriptorSize+i*sectionDescSize:]
		s := Section{
			DataOffset:     binary.LittleEndian.Uint32(b),
			RawDataSize:    binary.LittleEndian.Uint32(b[4:]),
			MemoryAddress:  binary.LittleEndian.Uint64(b[8:]),
			MemoryDataSize: binary.LittleEndian.Uint64(b[16:]),
			Type:           SectionType(binary.LittleEndian.Uint32(b[24:])),
			Attributes:     binary.LittleEndian.Uint32(b[28:]),
		}
		if err := s.validate(n); err != nil {
			return nil, fmt.Errorf("tdx: TDVF section %d (%s): %w", i, s.Type, err)
		}
		md.Sections = append(md.Sections, s)
	}
	if err := checkOverlaps(md.Sections); err != nil {
		return nil, err
	}
	return md, nil
}

// validate checks one section against the firmware size n.
func (s Section) validate(n int64) error {
	switch {
	case s.MemoryAddress%pageSize != 0:
		return fmt.Errorf("memory address %#x is not 4 KiB aligned", s.MemoryAddress)
	case s.MemoryDataSize%pageSize != 0:
		return fmt.Errorf("memory size %#x is not a multiple of 4 KiB", s.MemoryDataSize)
	case s.MemoryDataSize == 0:
		return errors.New("memory size is zero")
	case s.MemoryAddress+s.MemoryDataSize < s.MemoryAddress:
		return fmt.Errorf("memory range %#x+%#x overflows", s.MemoryAddress, s.MemoryDataSize)
	case uint64(s.RawDataSize) > s.MemoryDataSize:
		return fmt.Errorf("raw data size %#x exceeds memory size %#x", s.RawDataSize, s.MemoryDataSize)
	case int64(s.DataOffset)+int64(s.RawDataSize) > n:
		return fmt.Errorf("raw data [%#x, +%#x) runs past the end of the %d-byte firmware", s.DataOffset, s.RawDataSize, n)
	case s.Attributes&^(AttrMRExtend|AttrPageAug) != 0:
		return fmt.Errorf("unknown attributes %#x", s.Attributes)
	case s.Attributes&AttrMRExtend != 0 && s.Attributes&AttrPageAug != 0:
		return errors.New("both MR.EXTEND and PAGE.AUG are set, but PAGE.AUG pages cannot be measured")
	}
	return nil
}

// checkOverlaps rejects sections whose memory ranges intersect.
func checkOverlaps(secs []Section) error {
	for i, a := range secs {
		for j := i + 1; j < len(secs); j++ {
			b := secs[j]
			if a.MemoryAddress < b.MemoryAddress+b.MemoryDataSize && b.MemoryAddress < a.MemoryAddress+a.MemoryDataSize {
				return fmt.Errorf("tdx: TDVF sections %d (%s at %#x) and %d (%s at %#x) overlap in guest memory",
					i, a.Type, a.MemoryAddress, j, b.Type, b.MemoryAddress)
			}
		}
	}
	return nil
}

// Section returns the first section of type t.
func (m *Metadata) Section(t SectionType) (Section, bool) {
	for _, s := range m.Sections {
		if s.Type == t {
			return s, true
		}
	}
	return Section{}, false
}
