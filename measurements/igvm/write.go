package igvm

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// Marshal encodes f as an IGVM file. Header order is kept; file offsets,
// sizes and the checksum are computed, so the FileOffset fields of the
// headers are ignored (and not updated). Identical data blobs are stored
// once. Page data longer than a 4 KiB page, a VP context longer than a page,
// a header in the wrong section or a file over 4 GiB are errors.
func Marshal(f *File) ([]byte, error) {
	fixedSize := fixedHeaderSizeV1
	switch f.FormatVersion {
	case 0, FormatVersion1:
	case FormatVersion2:
		fixedSize = fixedHeaderSizeV2
	default:
		return nil, fmt.Errorf("igvm: cannot write format version %d (1 or 2)", f.FormatVersion)
	}
	w := &writer{blobs: map[string]uint32{}}
	for _, sec := range []struct {
		want Section
		hs   []Header
	}{{SectionPlatform, f.Platform}, {SectionInitialization, f.Initialization}, {SectionDirective, f.Directives}} {
		for i, h := range sec.hs {
			if h == nil {
				return nil, fmt.Errorf("igvm: %s header %d is nil", sec.want, i)
			}
			if got := h.Type().Section(); got != sec.want {
				return nil, fmt.Errorf("igvm: header %d of the %s section is a %s header (%s)", i, sec.want, got, h.Type())
			}
			if err := w.header(h); err != nil {
				return nil, fmt.Errorf("igvm: %s header %d (%s): %w", sec.want, i, h.Type(), err)
			}
		}
	}
	varOff := uint64(fixedSize+7) &^ 7
	varSize := uint64(len(w.vh))
	dataStart := varOff + varSize
	total := dataStart + uint64(len(w.data))
	if total > math.MaxUint32 {
		return nil, fmt.Errorf("igvm: the file would be %d bytes; IGVM files are limited to 4 GiB", total)
	}
	// Relocate the data offsets, relative to the data section so far, to
	// absolute file offsets.
	le := binary.LittleEndian
	for _, fix := range w.fixups {
		rel := le.Uint32(w.vh[fix:])
		le.PutUint32(w.vh[fix:], rel+uint32(dataStart))
	}
	out := make([]byte, total)
	le.PutUint32(out[0:], Magic)
	version := f.FormatVersion
	if version == 0 {
		version = FormatVersion1
	}
	le.PutUint32(out[4:], version)
	le.PutUint32(out[8:], uint32(varOff))
	le.PutUint32(out[12:], uint32(varSize))
	le.PutUint32(out[16:], uint32(total))
	if version == FormatVersion2 {
		le.PutUint32(out[24:], f.Architecture)
		ps := f.PageSize
		if ps == 0 {
			ps = PageSize
		}
		le.PutUint32(out[28:], ps)
	}
	copy(out[varOff:], w.vh)
	copy(out[dataStart:], w.data)
	crc := crc32.NewIEEE()
	crc.Write(out[:fixedSize])
	crc.Write(out[varOff:dataStart])
	le.PutUint32(out[20:], crc.Sum32())
	return out, nil
}

type writer struct {
	vh     []byte
	data   []byte
	blobs  map[string]uint32 // blob contents -> offset in data (+1)
	fixups []int             // positions in vh of data-relative offsets
}

// blob appends b to the file data (once per distinct contents) and returns
// the vh position fixup marker value: the offset within the data section.
func (w *writer) blob(b []byte, align int) uint32 {
	if off, ok := w.blobs[string(b)]; ok {
		return off - 1
	}
	for len(w.data)%align != 0 {
		w.data = append(w.data, 0)
	}
	off := uint32(len(w.data))
	w.data = append(w.data, b...)
	w.blobs[string(b)] = off + 1
	return off
}

func (w *writer) header(h Header) error {
	le := binary.LittleEndian
	var body []byte
	u16 := func(v uint16) { body = le.AppendUint16(body, v) }
	u32 := func(v uint32) { body = le.AppendUint32(body, v) }
	u64 := func(v uint64) { body = le.AppendUint64(body, v) }
	// dataRef writes a file offset field for blob b (0 when b is empty).
	var fix []int
	dataRef := func(b []byte, align int) {
		if len(b) == 0 {
			u32(0)
			return
		}
		fix = append(fix, len(body))
		u32(w.blob(b, align))
	}
	switch h := h.(type) {
	case *SupportedPlatform:
		u32(h.CompatibilityMask)
		body = append(body, h.HighestVTL, byte(h.PlatformType))
		u16(h.PlatformVersion)
		u64(h.SharedGPABoundary)
	case *GuestPolicy:
		u64(h.Policy)
		u32(h.CompatibilityMask)
		u32(0)
	case *RelocatableRegion:
		u32(h.CompatibilityMask)
		u16(h.VPIndex)
		body = append(body, h.VTL, h.Flags)
		u64(h.RelocationAlignment)
		u64(h.RegionGPA)
		u64(h.RegionSize)
		u64(h.MinimumGPA)
		u64(h.MaximumGPA)
	case *PageTableRelocation:
		u32(h.CompatibilityMask)
		u16(h.VPIndex)
		body = append(body, h.VTL, 0)
		u64(h.GPA)
		u64(h.Size)
		u64(h.UsedSize)
	case *CorimData:
		if h.Kind != TypeCorimDocument && h.Kind != TypeCorimSignature {
			return fmt.Errorf("CorimData kind must be CORIM_DOCUMENT or CORIM_SIGNATURE")
		}
		u32(h.CompatibilityMask)
		dataRef(h.Data, 8)
		u32(uint32(len(h.Data)))
		u32(0)
	case *CCAPolicy:
		u32(h.CompatibilityMask)
		u32(0)
		u64(h.AttributesRequiredZeroes)
		u64(h.AttributesRequiredOnes)
		body = append(body, h.HashAlgorithm, h.LFAPolicy, 0, 0, 0, 0, 0, 0)
	case *ParameterArea:
		if len(h.InitialData) != 0 && uint64(len(h.InitialData)) != h.NumberOfBytes {
			return fmt.Errorf("initial data is %d bytes, the area %d", len(h.InitialData), h.NumberOfBytes)
		}
		u64(h.NumberOfBytes)
		u32(h.Index)
		dataRef(h.InitialData, 8)
	case *PageData:
		if len(h.Data) > PageSize {
			return fmt.Errorf("page data is %d bytes; IGVM page data is at most one 4 KiB page", len(h.Data))
		}
		if h.GPA%h.Flags.Size() != 0 {
			return fmt.Errorf("GPA %#x is not aligned to its %#x-byte page", h.GPA, h.Flags.Size())
		}
		u64(h.GPA)
		u32(h.CompatibilityMask)
		data := h.Data
		if len(data) > 0 && len(data) < PageSize {
			data = append(append([]byte(nil), data...), make([]byte, PageSize-len(data))...)
		}
		dataRef(data, 8)
		u32(uint32(h.Flags))
		u16(uint16(h.DataType))
		u16(0)
	case *ParameterInsert:
		u64(h.GPA)
		u32(h.CompatibilityMask)
		u32(h.Index)
	case *VPContext:
		if len(h.Data) == 0 || len(h.Data) > PageSize {
			return fmt.Errorf("VP context data is %d bytes; it must be 1 to 4096", len(h.Data))
		}
		data := h.Data
		if len(data) < PageSize {
			data = append(append([]byte(nil), data...), make([]byte, PageSize-len(data))...)
		}
		u64(h.GPA)
		u32(h.CompatibilityMask)
		dataRef(data, 8)
		u16(h.VPIndex)
		u16(0)
	case *RequiredMemory:
		u64(h.GPA)
		u32(h.CompatibilityMask)
		u32(h.NumberOfBytes)
		u32(h.Flags)
		u32(0)
	case *Parameter:
		if bodySizes[h.Kind&^OptionalBit] != 8 {
			return fmt.Errorf("%s is not a parameter header type", h.Kind)
		}
		u32(h.Index)
		u32(h.ByteOffset)
	case *SNPIDBlock:
		body = encodeIDBlock(h)
	case *ErrorRange:
		u64(h.GPA)
		u32(h.CompatibilityMask)
		u32(h.SizeBytes)
	case *VBSMeasurement:
		if len(h.Body) != bodySizes[TypeVBSMeasurement]-4 {
			return fmt.Errorf("VBS measurement body is %d bytes, want %d", len(h.Body), bodySizes[TypeVBSMeasurement]-4)
		}
		u32(h.CompatibilityMask)
		body = append(body, h.Body...)
	case *Unknown:
		if _, known := bodySizes[h.HeaderType&^OptionalBit]; known {
			return fmt.Errorf("type %s is known; use its struct, not Unknown", h.HeaderType)
		}
		if h.HeaderType&OptionalBit == 0 {
			return fmt.Errorf("an unknown header type must have the optional bit set")
		}
		body = append(body, h.Body...)
	default:
		return fmt.Errorf("unsupported header type %T", h)
	}
	start := len(w.vh)
	w.vh = le.AppendUint32(w.vh, uint32(h.Type()))
	w.vh = le.AppendUint32(w.vh, uint32(len(body)))
	for _, f := range fix {
		w.fixups = append(w.fixups, start+tlvHeaderSize+f)
	}
	w.vh = append(w.vh, body...)
	for len(w.vh)%8 != 0 {
		w.vh = append(w.vh, 0)
	}
	return nil
}

func encodeIDBlock(h *SNPIDBlock) []byte {
	le := binary.LittleEndian
	b := make([]byte, 0, bodySizes[TypeSNPIDBlock])
	b = le.AppendUint32(b, h.CompatibilityMask)
	b = append(b, h.AuthorKeyEnabled, 0, 0, 0)
	b = append(b, h.LD[:]...)
	b = append(b, h.FamilyID[:]...)
	b = append(b, h.ImageID[:]...)
	b = le.AppendUint32(b, h.Version)
	b = le.AppendUint32(b, h.GuestSVN)
	b = le.AppendUint32(b, h.IDKeyAlgorithm)
	b = le.AppendUint32(b, h.AuthorKeyAlgorithm)
	sig := func(s SNPSignature) { b = append(append(b, s.R[:]...), s.S[:]...) }
	key := func(k SNPPublicKey) {
		b = le.AppendUint32(b, k.Curve)
		b = le.AppendUint32(b, 0)
		b = append(append(b, k.QX[:]...), k.QY[:]...)
	}
	sig(h.IDKeySignature)
	key(h.IDPublicKey)
	sig(h.AuthorKeySignature)
	key(h.AuthorPublicKey)
	return b
}
