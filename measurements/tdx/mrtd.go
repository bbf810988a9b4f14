package tdx

import (
	"crypto/sha512"
	"encoding/binary"
	"fmt"
	"hash"
)

const (
	recordSize = 128
	chunkSize  = 256
	// Bounds on the work a metadata table may ask for; real TDVF images
	// stay far below (a few MiB extended, a few thousand pages added).
	maxExtendBytes = 64 << 20
	maxAddedPages  = 1 << 18 // 1 GiB
)

// Ordering selects how the VMM interleaves TDH.MEM.PAGE.ADD and
// TDH.MR.EXTEND.
type Ordering int

const (
	// PerPage adds each page and then extends it before moving to the next
	// page: upstream QEMU/KVM (KVM_TDX_INIT_MEM_REGION).
	PerPage Ordering = iota
	// TwoPass adds every page of a section, then extends every page of
	// it: the QEMU 8.x TDX patch series.
	TwoPass
)

// String names the ordering.
func (o Ordering) String() string {
	if o == TwoPass {
		return "two-pass"
	}
	return "per-page"
}

// Options selects the VMM behaviour MRTD models. The zero value is
// upstream QEMU with KVM.
type Options struct {
	Ordering Ordering
	// SkipPageAug leaves out sections with the PAGE.AUG attribute, as the
	// TDVF design guide intends and virtee/tdx-measure does. Upstream QEMU
	// ignores the attribute and adds such sections like any other. The two
	// agree on firmware without PAGE.AUG sections, such as Debian 12's OVMF.
	SkipPageAug bool
}

// MRTD computes the MRTD of a TD whose firmware is fw with metadata md.
func MRTD(fw []byte, md *Metadata, opts Options) ([48]byte, error) {
	var out [48]byte
	var added, extended uint64
	skip := func(s Section) bool { return opts.SkipPageAug && s.Attributes&AttrPageAug != 0 }
	for i, s := range md.Sections {
		// Check each section on its own first, so the sums cannot wrap.
		if s.MemoryDataSize > maxExtendBytes && s.MemoryDataSize/pageSize > maxAddedPages {
			return out, fmt.Errorf("tdx: TDVF section %d (%s) is %d MiB, beyond this tool's limits; the metadata is probably corrupt", i, s.Type, s.MemoryDataSize>>20)
		}
		if !skip(s) {
			added += s.MemoryDataSize / pageSize
		}
		if s.Attributes&AttrMRExtend != 0 {
			extended += s.MemoryDataSize
		}
		if int64(s.DataOffset)+int64(s.RawDataSize) > int64(len(fw)) {
			return out, fmt.Errorf("tdx: TDVF section %d raw data runs past the end of the %d-byte firmware", i, len(fw))
		}
	}
	if added > maxAddedPages || extended > maxExtendBytes {
		return out, fmt.Errorf("tdx: TDVF metadata asks to add %d pages and extend %d MiB, beyond this tool's limits (%d pages, %d MiB); the metadata is probably corrupt",
			added, extended>>20, maxAddedPages, maxExtendBytes>>20)
	}
	h := sha512.New384()
	for _, s := range md.Sections {
		if skip(s) {
			continue
		}
		raw := fw[s.DataOffset : s.DataOffset+s.RawDataSize]
		pages := s.MemoryDataSize / pageSize
		extend := s.Attributes&AttrMRExtend != 0
		switch opts.Ordering {
		case PerPage:
			for p := uint64(0); p < pages; p++ {
				pageAdd(h, s.MemoryAddress+p*pageSize)
				if extend {
					mrExtendPage(h, s.MemoryAddress+p*pageSize, raw, p*pageSize)
				}
			}
		case TwoPass:
			for p := uint64(0); p < pages; p++ {
				pageAdd(h, s.MemoryAddress+p*pageSize)
			}
			if extend {
				for p := uint64(0); p < pages; p++ {
					mrExtendPage(h, s.MemoryAddress+p*pageSize, raw, p*pageSize)
				}
			}
		default:
			return out, fmt.Errorf("tdx: unknown ordering %d", opts.Ordering)
		}
	}
	copy(out[:], h.Sum(nil))
	return out, nil
}

// record writes a 128-byte MRTD record: the operation name at byte 0, the
// GPA at byte 16, zeros elsewhere.
func record(h hash.Hash, op string, gpa uint64) {
	var b [recordSize]byte
	copy(b[:], op)
	binary.LittleEndian.PutUint64(b[16:], gpa)
	h.Write(b[:])
}

func pageAdd(h hash.Hash, gpa uint64) { record(h, "MEM.PAGE.ADD", gpa) }

// mrExtendPage extends the page at gpa whose contents start at offset off
// of the section's raw data (zero beyond its end).
func mrExtendPage(h hash.Hash, gpa uint64, raw []byte, off uint64) {
	var chunk [chunkSize]byte
	for c := uint64(0); c < pageSize; c += chunkSize {
		record(h, "MR.EXTEND", gpa+c)
		clear(chunk[:])
		if o := off + c; o < uint64(len(raw)) {
			copy(chunk[:], raw[o:])
		}
		h.Write(chunk[:])
	}
}

// FirmwareMRTD parses fw's TDVF metadata and computes its MRTD.
func FirmwareMRTD(fw []byte, opts Options) ([48]byte, error) {
	md, err := Parse(fw)
	if err != nil {
		return [48]byte{}, err
	}
	return MRTD(fw, md, opts)
}
