// Package ovmf parses the parts of an OVMF (EDK II) firmware image that
// confidential-VM launch measurements depend on: the GUIDed footer table at
// the end of the image, the SEV metadata (OvmfSevMetadata) with its
// sections, the SEV-ES AP reset block and the SEV hashes table location.
//
// The package is pure: Parse takes the image bytes and returns the parsed
// structures; it does no file I/O and never panics on malformed input.
//
// The footer table is walked backwards from the footer entry, which ends
// 0x20 bytes before the end of the image. Each entry is laid out as
// (data, uint16 size, GUID) with size covering the whole entry. Any entry,
// including ones this package does not interpret (such as the TDX metadata
// offset, TDXMetadataOffsetGUID), is available through
// (*Firmware).TableEntry.
package ovmf

import (
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	// footerOffset is the distance between the end of the footer table and
	// the end of the firmware image.
	footerOffset = 0x20
	// entryHeaderSize is the size of a footer table entry's trailer:
	// uint16 size followed by the GUID.
	entryHeaderSize = 2 + 16
	// metadataHeaderSize is sizeof(OvmfSevMetadata) without its sections.
	metadataHeaderSize = 16
	// sectionDescSize is sizeof(OvmfSevMetadataSectionDesc).
	sectionDescSize = 12
)

// ErrNoFooterTable is returned (wrapped) by Parse when the image does not end
// with an OVMF footer table. Such an image carries no SEV or TDX metadata.
var ErrNoFooterTable = errors.New("ovmf: no OVMF footer table (GUID 96b582de-1fb2-45f7-baea-a366c55a082d) 0x20 bytes before the end of the firmware; is this an OVMF image built with SEV/TDX support?")

// TableEntry is one entry of the OVMF footer table.
type TableEntry struct {
	GUID GUID
	// Data is the entry's payload, without the trailing size and GUID. It
	// aliases the firmware image.
	Data []byte
}

// SectionType is the type of an OvmfSevMetadata section.
type SectionType uint32

// Section types declared by OvmfPkg/ResetVector/X64/OvmfSevMetadata.asm.
const (
	SectionSNPSecMem       SectionType = 1
	SectionSNPSecrets      SectionType = 2
	SectionCPUID           SectionType = 3
	SectionSVSMCAA         SectionType = 4
	SectionSNPKernelHashes SectionType = 0x10
)

// String returns the EDK II name of the section type.
func (t SectionType) String() string {
	switch t {
	case SectionSNPSecMem:
		return "SNP_SEC_MEM"
	case SectionSNPSecrets:
		return "SNP_SECRETS"
	case SectionCPUID:
		return "CPUID"
	case SectionSVSMCAA:
		return "SVSM_CAA"
	case SectionSNPKernelHashes:
		return "SNP_KERNEL_HASHES"
	}
	return fmt.Sprintf("unknown(%#x)", uint32(t))
}

// Section is one OvmfSevMetadataSectionDesc: a guest-physical range the VMM
// must populate (and the SNP launch digest must cover) in a given way.
type Section struct {
	GPA  uint32
	Size uint32
	Type SectionType
}

// SevMetadata is the parsed OvmfSevMetadata structure ("ASEV").
type SevMetadata struct {
	// Offset is the offset of the structure from the start of the image.
	Offset   int
	Version  uint32
	Sections []Section
}

// HashTableArea is the payload of the SevHashTableGUID entry: where in guest
// memory QEMU places the kernel/initrd/cmdline hashes table.
type HashTableArea struct {
	GPA  uint32
	Size uint32
}

// Firmware is a parsed OVMF image.
type Firmware struct {
	// Data is the whole image, as passed to Parse (not copied).
	Data []byte
	// Table lists the footer table entries from the last one (nearest the
	// footer) to the first, the order they are walked in.
	Table []TableEntry
	// Metadata is the SEV metadata, or nil if the image has none.
	Metadata *SevMetadata
}

// Parse parses the footer table and, if present, the SEV metadata of the
// firmware image fw. It returns an error wrapping ErrNoFooterTable when the
// image has no footer table, and a descriptive error for any truncated or
// inconsistent structure.
func Parse(fw []byte) (*Firmware, error) {
	f := &Firmware{Data: fw}
	if err := f.parseFooterTable(); err != nil {
		return nil, err
	}
	if err := f.parseSevMetadata(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *Firmware) parseFooterTable() error {
	n := len(f.Data)
	footerStart := n - footerOffset - entryHeaderSize
	if footerStart < 0 {
		return fmt.Errorf("ovmf: firmware is only %d bytes, too short to hold the footer table (needs at least %d): %w",
			n, footerOffset+entryHeaderSize, ErrNoFooterTable)
	}
	footer := f.Data[footerStart : n-footerOffset]
	if GUID(footer[2:]) != FooterTableGUID {
		return fmt.Errorf("ovmf: %d-byte firmware: %w", n, ErrNoFooterTable)
	}
	size := int(binary.LittleEndian.Uint16(footer))
	if size < entryHeaderSize {
		return fmt.Errorf("ovmf: footer table size %d is smaller than its own %d-byte header", size, entryHeaderSize)
	}
	tableLen := size - entryHeaderSize
	if tableLen > footerStart {
		return fmt.Errorf("ovmf: footer table claims %d bytes but only %d precede it in the firmware", tableLen, footerStart)
	}
	table := f.Data[footerStart-tableLen : footerStart]
	for len(table) >= entryHeaderSize {
		hdr := table[len(table)-entryHeaderSize:]
		esize := int(binary.LittleEndian.Uint16(hdr))
		g := GUID(hdr[2:])
		if esize < entryHeaderSize {
			return fmt.Errorf("ovmf: footer table entry %s has size %d, smaller than its %d-byte header", g, esize, entryHeaderSize)
		}
		if esize > len(table) {
			return fmt.Errorf("ovmf: footer table entry %s has size %d but only %d bytes of the table remain", g, esize, len(table))
		}
		f.Table = append(f.Table, TableEntry{GUID: g, Data: table[len(table)-esize : len(table)-entryHeaderSize]})
		table = table[:len(table)-esize]
	}
	return nil
}

func (f *Firmware) parseSevMetadata() error {
	entry, ok := f.TableEntry(SevMetadataGUID)
	if !ok {
		return nil
	}
	if len(entry) < 4 {
		return fmt.Errorf("ovmf: SEV metadata table entry is %d bytes, want at least 4", len(entry))
	}
	n := len(f.Data)
	fromEnd := int64(binary.LittleEndian.Uint32(entry))
	if fromEnd > int64(n) || fromEnd < metadataHeaderSize {
		return fmt.Errorf("ovmf: SEV metadata offset %#x from the end is outside the %d-byte firmware", fromEnd, n)
	}
	start := n - int(fromEnd)
	hdr := f.Data[start : start+metadataHeaderSize]
	if string(hdr[:4]) != "ASEV" {
		return fmt.Errorf("ovmf: SEV metadata at offset %#x has signature %q, want \"ASEV\"", start, hdr[:4])
	}
	size := int64(binary.LittleEndian.Uint32(hdr[4:]))
	version := binary.LittleEndian.Uint32(hdr[8:])
	count := int64(binary.LittleEndian.Uint32(hdr[12:]))
	if version != 1 {
		return fmt.Errorf("ovmf: SEV metadata version %d is not supported (want 1)", version)
	}
	need := metadataHeaderSize + count*sectionDescSize
	if need > size {
		return fmt.Errorf("ovmf: SEV metadata declares %d sections, which do not fit its size %d", count, size)
	}
	if int64(start)+need > int64(n) {
		return fmt.Errorf("ovmf: SEV metadata at offset %#x with %d sections runs past the end of the %d-byte firmware", start, count, n)
	}
	md := &SevMetadata{Offset: start, Version: version, Sections: make([]Section, 0, count)}
	for i := int64(0); i < count; i++ {
		d := f.Data[start+metadataHeaderSize+int(i)*sectionDescSize:]
		md.Sections = append(md.Sections, Section{
			GPA:  binary.LittleEndian.Uint32(d),
			Size: binary.LittleEndian.Uint32(d[4:]),
			Type: SectionType(binary.LittleEndian.Uint32(d[8:])),
		})
	}
	f.Metadata = md
	return nil
}

// TableEntry returns the payload of the footer table entry with the given
// GUID. When the GUID occurs more than once, the entry nearest the start of
// the table (walked last) wins, as in the reference implementations.
func (f *Firmware) TableEntry(g GUID) ([]byte, bool) {
	var data []byte
	found := false
	for _, e := range f.Table {
		if e.GUID == g {
			data, found = e.Data, true
		}
	}
	return data, found
}

// tableUint32 returns the first little-endian uint32 of the entry g.
func (f *Firmware) tableUint32(g GUID, what string) (uint32, error) {
	e, ok := f.TableEntry(g)
	if !ok {
		return 0, fmt.Errorf("ovmf: firmware has no %s entry (GUID %s) in its footer table", what, g)
	}
	if len(e) < 4 {
		return 0, fmt.Errorf("ovmf: %s entry (GUID %s) is %d bytes, want at least 4", what, g, len(e))
	}
	return binary.LittleEndian.Uint32(e), nil
}

// SevESResetEIP returns the SEV-ES AP reset vector from the SEV-ES reset
// block entry.
func (f *Firmware) SevESResetEIP() (uint32, error) {
	return f.tableUint32(SevESResetBlockGUID, "SEV-ES reset block")
}

// SVSMEntryOffset returns, for a Coconut-SVSM image, the offset of the SVSM
// entry point from the start of the image (the SVSM_INFO entry).
func (f *Firmware) SVSMEntryOffset() (uint32, error) {
	return f.tableUint32(SVSMInfoGUID, "SVSM_INFO")
}

// SevHashTable returns the area reserved for QEMU's kernel hashes table. The
// size is 0 when the entry carries only the GPA.
func (f *Firmware) SevHashTable() (HashTableArea, error) {
	gpa, err := f.tableUint32(SevHashTableGUID, "SEV hash table")
	if err != nil {
		return HashTableArea{}, err
	}
	a := HashTableArea{GPA: gpa}
	if e, _ := f.TableEntry(SevHashTableGUID); len(e) >= 8 {
		a.Size = binary.LittleEndian.Uint32(e[4:])
	}
	return a, nil
}

// SupportsSevHashTable reports whether the image reserves a non-zero GPA
// for QEMU's kernel hashes table (needed to measure a direct kernel boot
// under SEV and SEV-ES).
func (f *Firmware) SupportsSevHashTable() bool {
	a, err := f.SevHashTable()
	return err == nil && a.GPA != 0
}

// Sections returns the SEV metadata sections, or nil if there are none.
func (f *Firmware) Sections() []Section {
	if f.Metadata == nil {
		return nil
	}
	return f.Metadata.Sections
}

// HasSection reports whether the SEV metadata declares a section of type t.
func (f *Firmware) HasSection(t SectionType) bool {
	for _, s := range f.Sections() {
		if s.Type == t {
			return true
		}
	}
	return false
}

// GPA returns the guest-physical address the image is mapped at when it
// ends at end (4 GiB for the OVMF flash, lower for an SVSM image placed
// below it). It is 0 if the image is larger than end.
func (f *Firmware) GPA(end uint64) uint64 {
	if uint64(len(f.Data)) > end {
		return 0
	}
	return end - uint64(len(f.Data))
}

// FourGiB is the end address of the OVMF flash mapping.
const FourGiB = 1 << 32
