// Package pecoff parses just enough of a PE/COFF image (an EFI application
// such as a Linux kernel with its EFI stub or a unified kernel image) to
// compute its Authenticode digest and to locate its sections by name.
//
// It is a small, bounds-checked parser rather than a wrapper of debug/pe:
// Authenticode needs the file offsets of the CheckSum field and of the
// certificate-table directory entry, which debug/pe does not expose, and
// debug/pe also reads COFF symbol and string tables that EFI images do not
// use. Every offset read from the image is checked against its length, so
// malformed input yields an error naming the problem, never a panic.
//
// The package is pure: it takes bytes and returns digests and structures.
package pecoff

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	dosHeaderSize   = 64
	coffHeaderSize  = 20
	sectionHdrSize  = 40
	magicPE32       = 0x10b
	magicPE32Plus   = 0x20b
	securityDirIdx  = 4 // IMAGE_DIRECTORY_ENTRY_SECURITY
	dataDirEntySize = 8
	// maxSections is the PE limit on NumberOfSections (96 for the Windows
	// loader; the field itself is 16 bits). A larger count is rejected.
	maxSections = 96
)

// ErrNotPE is wrapped by Parse when the input is not a PE image at all.
var ErrNotPE = errors.New("pecoff: not a PE/COFF image")

// Section is one entry of the section table.
type Section struct {
	// Name is the section name with trailing NULs removed (at most 8 bytes).
	Name             string
	VirtualSize      uint32
	VirtualAddress   uint32
	SizeOfRawData    uint32
	PointerToRawData uint32
	Characteristics  uint32
}

// DataDirectory is one entry of the optional header's data directory.
type DataDirectory struct {
	VirtualAddress uint32
	Size           uint32
}

// File is a parsed PE image. Its byte slices alias the input.
type File struct {
	data []byte

	// Machine is the COFF machine type (0x8664 for x86-64).
	Machine uint16
	// PE32Plus is true for a PE32+ (64-bit) optional header.
	PE32Plus bool
	// SizeOfHeaders is the optional header's SizeOfHeaders.
	SizeOfHeaders uint32
	// Sections is the section table in file order.
	Sections []Section

	stampOff    int // file offset of the COFF header's TimeDateStamp
	checksumOff int // file offset of the optional header's CheckSum
	// certDirOff is the file offset of the security data directory entry,
	// or -1 when the optional header has fewer than five entries.
	certDirOff int
	certDir    DataDirectory
}

// Parse parses the headers and the section table of the PE image data.
func Parse(data []byte) (*File, error) {
	if len(data) < dosHeaderSize || data[0] != 'M' || data[1] != 'Z' {
		return nil, fmt.Errorf("%w: no MZ DOS header at the start of the %d-byte file", ErrNotPE, len(data))
	}
	lfanew := int64(binary.LittleEndian.Uint32(data[0x3c:]))
	if lfanew+4+coffHeaderSize > int64(len(data)) {
		return nil, fmt.Errorf("%w: PE header offset %#x (e_lfanew) is past the end of the %d-byte file", ErrNotPE, lfanew, len(data))
	}
	pe := int(lfanew)
	if string(data[pe:pe+4]) != "PE\x00\x00" {
		return nil, fmt.Errorf("%w: no PE signature at offset %#x", ErrNotPE, pe)
	}
	coff := data[pe+4:]
	f := &File{data: data, Machine: binary.LittleEndian.Uint16(coff), stampOff: pe + 8, certDirOff: -1}
	nsec := int(binary.LittleEndian.Uint16(coff[2:]))
	optSize := int(binary.LittleEndian.Uint16(coff[16:]))
	opt := pe + 4 + coffHeaderSize
	if nsec == 0 {
		return nil, errors.New("pecoff: PE file has no sections")
	}
	if nsec > maxSections {
		return nil, fmt.Errorf("pecoff: PE file declares %d sections, more than the PE limit of %d", nsec, maxSections)
	}
	if optSize < 2 || opt+optSize > len(data) {
		return nil, fmt.Errorf("pecoff: optional header (%d bytes at %#x) does not fit the %d-byte file", optSize, opt, len(data))
	}
	var ddOff, minOpt int
	switch magic := binary.LittleEndian.Uint16(data[opt:]); magic {
	case magicPE32:
		ddOff, minOpt = 96, 96
	case magicPE32Plus:
		ddOff, minOpt = 112, 112
		f.PE32Plus = true
	default:
		return nil, fmt.Errorf("pecoff: unknown optional header magic %#x (want %#x or %#x)", magic, magicPE32, magicPE32Plus)
	}
	if optSize < minOpt {
		return nil, fmt.Errorf("pecoff: optional header is %d bytes, too short for its magic (needs %d)", optSize, minOpt)
	}
	f.SizeOfHeaders = binary.LittleEndian.Uint32(data[opt+60:])
	f.checksumOff = opt + 64
	nDirs := int64(binary.LittleEndian.Uint32(data[opt+ddOff-4:]))
	if int64(ddOff)+nDirs*dataDirEntySize > int64(optSize) {
		return nil, fmt.Errorf("pecoff: %d data directories do not fit the %d-byte optional header", nDirs, optSize)
	}
	if nDirs > securityDirIdx {
		f.certDirOff = opt + ddOff + securityDirIdx*dataDirEntySize
		f.certDir = DataDirectory{
			VirtualAddress: binary.LittleEndian.Uint32(data[f.certDirOff:]),
			Size:           binary.LittleEndian.Uint32(data[f.certDirOff+4:]),
		}
	}
	secTab := opt + optSize
	if secTab+nsec*sectionHdrSize > len(data) {
		return nil, fmt.Errorf("pecoff: section table (%d entries at %#x) runs past the end of the %d-byte file", nsec, secTab, len(data))
	}
	if int64(f.SizeOfHeaders) > int64(len(data)) {
		return nil, fmt.Errorf("pecoff: SizeOfHeaders %#x is larger than the %d-byte file", f.SizeOfHeaders, len(data))
	}
	if int(f.SizeOfHeaders) < secTab+nsec*sectionHdrSize {
		return nil, fmt.Errorf("pecoff: SizeOfHeaders %#x does not cover the headers and section table (%#x bytes)", f.SizeOfHeaders, secTab+nsec*sectionHdrSize)
	}
	for i := 0; i < nsec; i++ {
		h := data[secTab+i*sectionHdrSize:]
		name := h[:8]
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		s := Section{
			Name:             string(name),
			VirtualSize:      binary.LittleEndian.Uint32(h[8:]),
			VirtualAddress:   binary.LittleEndian.Uint32(h[12:]),
			SizeOfRawData:    binary.LittleEndian.Uint32(h[16:]),
			PointerToRawData: binary.LittleEndian.Uint32(h[20:]),
			Characteristics:  binary.LittleEndian.Uint32(h[36:]),
		}
		if s.SizeOfRawData > 0 && uint64(s.PointerToRawData)+uint64(s.SizeOfRawData) > uint64(len(data)) {
			return nil, fmt.Errorf("pecoff: section %d (%q) raw data [%#x, +%#x) runs past the end of the %d-byte file",
				i, s.Name, s.PointerToRawData, s.SizeOfRawData, len(data))
		}
		f.Sections = append(f.Sections, s)
	}
	if f.certDir.Size > 0 {
		end := uint64(f.certDir.VirtualAddress) + uint64(f.certDir.Size)
		if end > uint64(len(data)) || f.certDir.VirtualAddress < f.SizeOfHeaders {
			return nil, fmt.Errorf("pecoff: certificate table [%#x, +%#x) lies outside the %d-byte file",
				f.certDir.VirtualAddress, f.certDir.Size, len(data))
		}
	}
	return f, nil
}

// CertificateTable returns the security data directory entry: the file
// offset and size of the attribute certificate table (the embedded
// signatures). Size is zero for an unsigned image.
func (f *File) CertificateTable() DataDirectory { return f.certDir }

// Section returns the first section whose name equals name, comparing at
// most the 8 bytes a section header holds, as the EFI stub does.
func (f *File) Section(name string) (Section, bool) {
	if len(name) > 8 {
		name = name[:8]
	}
	for _, s := range f.Sections {
		if s.Name == name {
			return s, true
		}
	}
	return Section{}, false
}

// FileData returns the bytes of s stored in the file: the first
// min(VirtualSize, SizeOfRawData) bytes of its raw data, which is what an
// EFI loader copies from the file.
func (f *File) FileData(s Section) []byte {
	n := min(s.VirtualSize, s.SizeOfRawData)
	if n == 0 {
		// Parse only bounds-checks sections with raw data; an empty one
		// may carry any PointerToRawData.
		return nil
	}
	return f.data[s.PointerToRawData : s.PointerToRawData+n]
}

// WriteMemoryData writes to w the VirtualSize bytes that s occupies once
// loaded: its file data followed by zeros when VirtualSize exceeds
// SizeOfRawData. The zeros are written in chunks, never allocated at once.
func (f *File) WriteMemoryData(w io.Writer, s Section) error {
	fd := f.FileData(s)
	if _, err := w.Write(fd); err != nil {
		return err
	}
	var zeros [4096]byte
	for left := int64(s.VirtualSize) - int64(len(fd)); left > 0; left -= int64(len(zeros)) {
		if _, err := w.Write(zeros[:min(left, int64(len(zeros)))]); err != nil {
			return err
		}
	}
	return nil
}
