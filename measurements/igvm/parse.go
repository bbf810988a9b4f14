package igvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
)

// ErrNotIGVM is returned (wrapped) by Parse when the data does not start with
// the IGVM magic.
var ErrNotIGVM = errors.New("igvm: not an IGVM file (the first four bytes are not \"IGVM\")")

// ErrChecksum is returned (wrapped) by Parse when the CRC32 of the fixed and
// variable headers does not match the fixed header's checksum field.
var ErrChecksum = errors.New("igvm: header checksum mismatch")

// bodySizes is the exact value length of every header type Parse decodes.
var bodySizes = map[HeaderType]int{
	TypeSupportedPlatform:   16,
	TypeGuestPolicy:         16,
	TypeRelocatableRegion:   48,
	TypePageTableRelocation: 32,
	TypeCorimDocument:       16,
	TypeCorimSignature:      16,
	TypeCCAPolicy:           32,
	TypeParameterArea:       16,
	TypePageData:            24,
	TypeParameterInsert:     16,
	TypeVPContext:           20,
	TypeRequiredMemory:      24,
	TypeVPCount:             8,
	TypeSRAT:                8,
	TypeMADT:                8,
	TypeMMIORanges:          8,
	TypeSNPIDBlock:          696,
	TypeMemoryMap:           8,
	TypeErrorRange:          16,
	TypeCommandLine:         8,
	TypeSLIT:                8,
	TypePPTT:                8,
	TypeVBSMeasurement:      864,
	TypeDeviceTree:          8,
	TypeEnvironmentInfo:     8,
}

// parser holds the state of one Parse call.
type parser struct {
	file      []byte
	dataStart uint64 // first byte after the variable headers
}

// Parse decodes an IGVM file. The returned headers' Data fields alias file.
// It checks the magic, the format version, the total size, the header
// checksum, the alignment and padding of every variable header, the order of
// the sections, the exact size of every known header and that every file
// offset points into the file data section with its data inside the file.
func Parse(file []byte) (*File, error) {
	if len(file) < fixedHeaderSizeV1 {
		return nil, fmt.Errorf("igvm: truncated fixed header: the file has %d bytes, the fixed header needs %d", len(file), fixedHeaderSizeV1)
	}
	le := binary.LittleEndian
	if le.Uint32(file[0:]) != Magic {
		return nil, ErrNotIGVM
	}
	f := &File{FormatVersion: le.Uint32(file[4:])}
	fixedSize := fixedHeaderSizeV1
	switch f.FormatVersion {
	case FormatVersion1:
	case FormatVersion2:
		fixedSize = fixedHeaderSizeV2
		if len(file) < fixedSize {
			return nil, fmt.Errorf("igvm: truncated version 2 fixed header: the file has %d bytes, the header needs %d", len(file), fixedSize)
		}
		f.Architecture = le.Uint32(file[24:])
		f.PageSize = le.Uint32(file[28:])
		if f.Architecture > 1 {
			return nil, fmt.Errorf("igvm: unknown architecture %d in the version 2 fixed header (0 = x64, 1 = aarch64)", f.Architecture)
		}
		if f.PageSize != PageSize {
			return nil, fmt.Errorf("igvm: page size %d is not supported (only 4096)", f.PageSize)
		}
	default:
		return nil, fmt.Errorf("igvm: unsupported format version %d (this reader knows 1 and 2)", f.FormatVersion)
	}
	varOff := uint64(le.Uint32(file[8:]))
	varSize := uint64(le.Uint32(file[12:]))
	total := uint64(le.Uint32(file[16:]))
	sum := le.Uint32(file[20:])
	if total != uint64(len(file)) {
		return nil, fmt.Errorf("igvm: the fixed header says the file has %d bytes but it has %d (truncated, or trailing data)", total, len(file))
	}
	if varOff < uint64(fixedSize) || varOff%8 != 0 {
		return nil, fmt.Errorf("igvm: variable header offset %#x must be 8-byte aligned and at least the fixed header size %#x", varOff, fixedSize)
	}
	if varOff+varSize > total {
		return nil, fmt.Errorf("igvm: truncated variable headers: %#x bytes at offset %#x run past the end of the %#x-byte file", varSize, varOff, total)
	}

	crc := crc32.NewIEEE()
	hdr := append([]byte(nil), file[:fixedSize]...)
	le.PutUint32(hdr[20:], 0)
	crc.Write(hdr)
	crc.Write(file[varOff : varOff+varSize])
	if got := crc.Sum32(); got != sum {
		return nil, fmt.Errorf("%w: the fixed header says %#08x, the headers hash to %#08x", ErrChecksum, sum, got)
	}

	p := &parser{file: file, dataStart: varOff + varSize}
	if err := p.headers(f, file[varOff:varOff+varSize], varOff); err != nil {
		return nil, err
	}
	if err := validatePlatforms(f); err != nil {
		return nil, err
	}
	return f, nil
}

func (p *parser) headers(f *File, vh []byte, base uint64) error {
	le := binary.LittleEndian
	section := SectionPlatform
	for pos := uint64(0); pos < uint64(len(vh)); {
		at := base + pos
		if uint64(len(vh))-pos < tlvHeaderSize {
			return fmt.Errorf("igvm: truncated variable header at file offset %#x: %d bytes left, a type/length pair needs 8", at, uint64(len(vh))-pos)
		}
		typ := HeaderType(le.Uint32(vh[pos:]))
		length := uint64(le.Uint32(vh[pos+4:]))
		bodyStart := pos + tlvHeaderSize
		if length > uint64(len(vh))-bodyStart {
			return fmt.Errorf("igvm: truncated variable header %s at file offset %#x: its length %d runs past the end of the variable headers", typ, at, length)
		}
		body := vh[bodyStart : bodyStart+length]
		next := bodyStart + (length+7)&^7
		if next > uint64(len(vh)) {
			return fmt.Errorf("igvm: variable header %s at file offset %#x: its 8-byte alignment padding runs past the end of the variable headers", typ, at)
		}
		for _, b := range vh[bodyStart+length : next] {
			if b != 0 {
				return fmt.Errorf("igvm: variable header %s at file offset %#x has non-zero alignment padding", typ, at)
			}
		}
		sec := typ.Section()
		if sec == SectionInvalid {
			return fmt.Errorf("igvm: variable header type %#x at file offset %#x is in no section's type range", uint32(typ), at)
		}
		if sec < section {
			return fmt.Errorf("igvm: %s header %s at file offset %#x comes after a %s header; sections must be in the order platform, initialization, directive", sec, typ, at, section)
		}
		section = sec
		h, err := p.decode(typ, body)
		if err != nil {
			return fmt.Errorf("igvm: variable header %s at file offset %#x: %w", typ, at, err)
		}
		switch sec {
		case SectionPlatform:
			f.Platform = append(f.Platform, h)
		case SectionInitialization:
			f.Initialization = append(f.Initialization, h)
		default:
			f.Directives = append(f.Directives, h)
		}
		pos = next
	}
	return nil
}

// data returns size bytes at file offset off (nil for offset 0).
func (p *parser) data(off uint32, size uint64, what string) ([]byte, error) {
	if off == 0 {
		return nil, nil
	}
	o := uint64(off)
	if o < p.dataStart {
		return nil, fmt.Errorf("%s file offset %#x points into the headers (file data starts at %#x)", what, off, p.dataStart)
	}
	if o > uint64(len(p.file)) || size > uint64(len(p.file))-o {
		return nil, fmt.Errorf("%s data offset past the end: %#x bytes at file offset %#x, but the file has %#x bytes", what, size, off, len(p.file))
	}
	return p.file[o : o+size], nil
}

func (p *parser) decode(typ HeaderType, b []byte) (Header, error) {
	base := typ &^ OptionalBit
	want, known := bodySizes[base]
	if !known {
		if typ&OptionalBit == 0 {
			return nil, fmt.Errorf("unknown header type %#x without the optional bit; a loader cannot skip it", uint32(typ))
		}
		return &Unknown{HeaderType: typ, Body: b}, nil
	}
	if len(b) != want {
		return nil, fmt.Errorf("length %d, the structure is %d bytes", len(b), want)
	}
	le := binary.LittleEndian
	u16 := func(o int) uint16 { return le.Uint16(b[o:]) }
	u32 := func(o int) uint32 { return le.Uint32(b[o:]) }
	u64 := func(o int) uint64 { return le.Uint64(b[o:]) }
	switch base {
	case TypeSupportedPlatform:
		return &SupportedPlatform{CompatibilityMask: u32(0), HighestVTL: b[4], PlatformType: PlatformType(b[5]),
			PlatformVersion: u16(6), SharedGPABoundary: u64(8)}, nil
	case TypeGuestPolicy:
		if u32(12) != 0 {
			return nil, errors.New("reserved field is not zero")
		}
		return &GuestPolicy{Policy: u64(0), CompatibilityMask: u32(8)}, nil
	case TypeRelocatableRegion:
		return &RelocatableRegion{CompatibilityMask: u32(0), VPIndex: u16(4), VTL: b[6], Flags: b[7],
			RelocationAlignment: u64(8), RegionGPA: u64(16), RegionSize: u64(24), MinimumGPA: u64(32), MaximumGPA: u64(40)}, nil
	case TypePageTableRelocation:
		return &PageTableRelocation{CompatibilityMask: u32(0), VPIndex: u16(4), VTL: b[6], GPA: u64(8), Size: u64(16), UsedSize: u64(24)}, nil
	case TypeCorimDocument, TypeCorimSignature:
		h := &CorimData{Kind: typ, CompatibilityMask: u32(0), FileOffset: u32(4)}
		d, err := p.data(h.FileOffset, uint64(u32(8)), "CoRIM")
		h.Data = d
		return h, err
	case TypeCCAPolicy:
		return &CCAPolicy{CompatibilityMask: u32(0), AttributesRequiredZeroes: u64(8), AttributesRequiredOnes: u64(16),
			HashAlgorithm: b[24], LFAPolicy: b[25]}, nil
	case TypeParameterArea:
		h := &ParameterArea{NumberOfBytes: u64(0), Index: u32(8), FileOffset: u32(12)}
		d, err := p.data(h.FileOffset, h.NumberOfBytes, "parameter area")
		h.InitialData = d
		return h, err
	case TypePageData:
		h := &PageData{GPA: u64(0), CompatibilityMask: u32(8), FileOffset: u32(12), Flags: PageDataFlags(u32(16)), DataType: PageDataType(u16(20))}
		if u16(22) != 0 {
			return nil, errors.New("reserved field is not zero")
		}
		if h.GPA%h.Flags.Size() != 0 {
			return nil, fmt.Errorf("GPA %#x is not aligned to its %#x-byte page", h.GPA, h.Flags.Size())
		}
		d, err := p.data(h.FileOffset, PageSize, "page")
		h.Data = d
		return h, err
	case TypeParameterInsert:
		h := &ParameterInsert{GPA: u64(0), CompatibilityMask: u32(8), Index: u32(12)}
		if h.GPA%PageSize != 0 {
			return nil, fmt.Errorf("GPA %#x is not page aligned", h.GPA)
		}
		return h, nil
	case TypeVPContext:
		h := &VPContext{GPA: u64(0), CompatibilityMask: u32(8), FileOffset: u32(12), VPIndex: u16(16)}
		if h.FileOffset == 0 {
			return nil, fmt.Errorf("VP context for VP %d has no data (file offset 0)", h.VPIndex)
		}
		size := uint64(PageSize)
		if rest := uint64(len(p.file)) - uint64(h.FileOffset); h.FileOffset != 0 && uint64(h.FileOffset) <= uint64(len(p.file)) && rest < size {
			size = rest // contexts of other platforms can be smaller than a page
		}
		d, err := p.data(h.FileOffset, size, "VP context")
		h.Data = d
		return h, err
	case TypeRequiredMemory:
		return &RequiredMemory{GPA: u64(0), CompatibilityMask: u32(8), NumberOfBytes: u32(12), Flags: u32(16)}, nil
	case TypeVPCount, TypeSRAT, TypeMADT, TypeMMIORanges, TypeMemoryMap, TypeCommandLine, TypeSLIT, TypePPTT, TypeDeviceTree, TypeEnvironmentInfo:
		return &Parameter{Kind: typ, Index: u32(0), ByteOffset: u32(4)}, nil
	case TypeSNPIDBlock:
		return decodeIDBlock(b), nil
	case TypeErrorRange:
		return &ErrorRange{GPA: u64(0), CompatibilityMask: u32(8), SizeBytes: u32(12)}, nil
	case TypeVBSMeasurement:
		return &VBSMeasurement{CompatibilityMask: u32(0), Body: b[4:]}, nil
	}
	return nil, fmt.Errorf("internal error: no decoder for %s", typ)
}

func decodeIDBlock(b []byte) *SNPIDBlock {
	le := binary.LittleEndian
	h := &SNPIDBlock{CompatibilityMask: le.Uint32(b[0:]), AuthorKeyEnabled: b[4]}
	copy(h.LD[:], b[8:56])
	copy(h.FamilyID[:], b[56:72])
	copy(h.ImageID[:], b[72:88])
	h.Version = le.Uint32(b[88:])
	h.GuestSVN = le.Uint32(b[92:])
	h.IDKeyAlgorithm = le.Uint32(b[96:])
	h.AuthorKeyAlgorithm = le.Uint32(b[100:])
	o := 104
	sig := func(s *SNPSignature) {
		copy(s.R[:], b[o:o+72])
		copy(s.S[:], b[o+72:o+144])
		o += 144
	}
	key := func(k *SNPPublicKey) {
		k.Curve = le.Uint32(b[o:])
		copy(k.QX[:], b[o+8:o+80])
		copy(k.QY[:], b[o+80:o+152])
		o += 152
	}
	sig(&h.IDKeySignature)
	key(&h.IDPublicKey)
	sig(&h.AuthorKeySignature)
	key(&h.AuthorPublicKey)
	return h
}

// validatePlatforms checks that every SUPPORTED_PLATFORM header owns exactly
// one mask bit and that no two share one.
func validatePlatforms(f *File) error {
	var seen uint32
	for _, sp := range f.Platforms() {
		if bits.OnesCount32(sp.CompatibilityMask) != 1 {
			return fmt.Errorf("igvm: SUPPORTED_PLATFORM for %s has compatibility mask %#x; it must have exactly one bit set", sp.PlatformType, sp.CompatibilityMask)
		}
		if seen&sp.CompatibilityMask != 0 {
			return fmt.Errorf("igvm: two SUPPORTED_PLATFORM headers share compatibility mask %#x", sp.CompatibilityMask)
		}
		seen |= sp.CompatibilityMask
	}
	return nil
}
