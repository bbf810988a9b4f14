// Package igvm reads and writes IGVM (Independent Guest Virtual Machine)
// files, the format Microsoft's IGVM specification defines for describing
// the initial memory and CPU state of a (confidential) guest, and computes
// the SEV-SNP launch digest such a file produces.
//
// An IGVM file is a fixed header (magic "IGVM", format version, the offset
// and size of the variable headers, the total file size and a CRC32 over the
// fixed and variable headers), followed by a list of 8-byte aligned
// type/length/value variable headers in three sections (platform,
// initialization, directives), followed by file data that the headers point
// into by absolute file offset. Headers carry a compatibility mask; each
// IGVM_VHT_SUPPORTED_PLATFORM header assigns one mask bit to one platform
// (SEV-SNP, TDX, VBS, native...), so one file can describe several
// platforms.
//
// Parse checks the structure strictly and returns errors (never panics) on
// malformed input; Marshal writes a File back, laying out file data and
// computing offsets, sizes and the checksum. SNPLaunchDigest measures the
// SEV-SNP directives the way QEMU's igvm-cfg loader with KVM does (or, with
// LoaderIGVMMeasure, as coconut-svsm's igvmmeasure does), on top of the
// launch digest chain of package snp. FromOVMF (and WriteOVMF, which also
// marshals and checks the result) writes the IGVM equivalent of a QEMU
// SEV-SNP boot of OVMF, with or without a direct kernel boot.
//
// The package does no file I/O.
package igvm

import "fmt"

// Magic is the value of the fixed header's first field: "IGVM" in
// little-endian byte order.
const Magic = 0x4D564749

// Format versions.
const (
	FormatVersion1 = 1
	FormatVersion2 = 2
)

// PageSize is the 4 KiB page every IGVM version 1 structure refers to.
const PageSize = 4096

// PageSize2M is the size of a PAGE_DATA page whose Is2MB flag is set.
const PageSize2M = 2 << 20

const (
	fixedHeaderSizeV1 = 24
	fixedHeaderSizeV2 = 32
	tlvHeaderSize     = 8
)

// HeaderType is the type of a variable header. Its top bit (OptionalBit)
// marks a header a loader that does not know it may skip.
type HeaderType uint32

// OptionalBit, set in a header type, tells a loader that does not recognise
// the type that it may ignore the header.
const OptionalBit HeaderType = 1 << 31

// Variable header types.
const (
	TypeSupportedPlatform   HeaderType = 0x001
	TypeGuestPolicy         HeaderType = 0x101
	TypeRelocatableRegion   HeaderType = 0x102
	TypePageTableRelocation HeaderType = 0x103
	TypeCorimDocument       HeaderType = 0x104
	TypeCorimSignature      HeaderType = 0x105
	TypeCCAPolicy           HeaderType = 0x106
	TypeParameterArea       HeaderType = 0x301
	TypePageData            HeaderType = 0x302
	TypeParameterInsert     HeaderType = 0x303
	TypeVPContext           HeaderType = 0x304
	TypeRequiredMemory      HeaderType = 0x305
	TypeReserved306         HeaderType = 0x306
	TypeVPCount             HeaderType = 0x307
	TypeSRAT                HeaderType = 0x308
	TypeMADT                HeaderType = 0x309
	TypeMMIORanges          HeaderType = 0x30A
	TypeSNPIDBlock          HeaderType = 0x30B
	TypeMemoryMap           HeaderType = 0x30C
	TypeErrorRange          HeaderType = 0x30D
	TypeCommandLine         HeaderType = 0x30E
	TypeSLIT                HeaderType = 0x30F
	TypePPTT                HeaderType = 0x310
	TypeVBSMeasurement      HeaderType = 0x311
	TypeDeviceTree          HeaderType = 0x312
	TypeEnvironmentInfo     HeaderType = 0x313
)

var typeNames = map[HeaderType]string{
	TypeSupportedPlatform:   "SUPPORTED_PLATFORM",
	TypeGuestPolicy:         "GUEST_POLICY",
	TypeRelocatableRegion:   "RELOCATABLE_REGION",
	TypePageTableRelocation: "PAGE_TABLE_RELOCATION_REGION",
	TypeCorimDocument:       "CORIM_DOCUMENT",
	TypeCorimSignature:      "CORIM_SIGNATURE",
	TypeCCAPolicy:           "CCA_POLICY",
	TypeParameterArea:       "PARAMETER_AREA",
	TypePageData:            "PAGE_DATA",
	TypeParameterInsert:     "PARAMETER_INSERT",
	TypeVPContext:           "VP_CONTEXT",
	TypeRequiredMemory:      "REQUIRED_MEMORY",
	TypeReserved306:         "RESERVED_DO_NOT_USE",
	TypeVPCount:             "VP_COUNT_PARAMETER",
	TypeSRAT:                "SRAT",
	TypeMADT:                "MADT",
	TypeMMIORanges:          "MMIO_RANGES",
	TypeSNPIDBlock:          "SNP_ID_BLOCK",
	TypeMemoryMap:           "MEMORY_MAP",
	TypeErrorRange:          "ERROR_RANGE",
	TypeCommandLine:         "COMMAND_LINE",
	TypeSLIT:                "SLIT",
	TypePPTT:                "PPTT",
	TypeVBSMeasurement:      "VBS_MEASUREMENT",
	TypeDeviceTree:          "DEVICE_TREE",
	TypeEnvironmentInfo:     "ENVIRONMENT_INFO_PARAMETER",
}

// String returns the specification's name of t (without the IGVM_VHT_
// prefix), with "|OPTIONAL" when the optional bit is set.
func (t HeaderType) String() string {
	base := t &^ OptionalBit
	name, ok := typeNames[base]
	if !ok {
		name = fmt.Sprintf("type(%#x)", uint32(base))
	}
	if t&OptionalBit != 0 {
		name += "|OPTIONAL"
	}
	return name
}

// Section is the part of the variable headers a header type belongs to.
type Section int

// Sections, in the order they must appear in a file.
const (
	SectionInvalid Section = iota
	SectionPlatform
	SectionInitialization
	SectionDirective
)

// String names the section.
func (s Section) String() string {
	switch s {
	case SectionPlatform:
		return "platform"
	case SectionInitialization:
		return "initialization"
	case SectionDirective:
		return "directive"
	}
	return "invalid"
}

// Section returns the section a header of type t belongs to, from the type
// ranges of the specification (optional bit ignored).
func (t HeaderType) Section() Section {
	base := t &^ OptionalBit
	switch {
	case base >= 0x1 && base <= 0x100:
		return SectionPlatform
	case base >= 0x101 && base <= 0x200:
		return SectionInitialization
	case base >= 0x301 && base <= 0x400:
		return SectionDirective
	}
	return SectionInvalid
}

// PlatformType is the isolation platform of a SUPPORTED_PLATFORM header.
type PlatformType uint8

// Platform types.
const (
	PlatformNative       PlatformType = 0
	PlatformVSMIsolation PlatformType = 1
	PlatformSEVSNP       PlatformType = 2
	PlatformTDX          PlatformType = 3
	PlatformSEV          PlatformType = 4
	PlatformSEVES        PlatformType = 5
	PlatformCCA          PlatformType = 6
)

// String names the platform.
func (p PlatformType) String() string {
	switch p {
	case PlatformNative:
		return "native"
	case PlatformVSMIsolation:
		return "vbs"
	case PlatformSEVSNP:
		return "sev-snp"
	case PlatformTDX:
		return "tdx"
	case PlatformSEV:
		return "sev"
	case PlatformSEVES:
		return "sev-es"
	case PlatformCCA:
		return "cca"
	}
	return fmt.Sprintf("platform(%d)", uint8(p))
}

// PageDataType is the data type of a PAGE_DATA header.
type PageDataType uint16

// Page data types.
const (
	PageDataNormal    PageDataType = 0
	PageDataSecrets   PageDataType = 1
	PageDataCPUIDData PageDataType = 2
	PageDataCPUIDXF   PageDataType = 3
)

// String names the page data type.
func (d PageDataType) String() string {
	switch d {
	case PageDataNormal:
		return "normal"
	case PageDataSecrets:
		return "secrets"
	case PageDataCPUIDData:
		return "cpuid"
	case PageDataCPUIDXF:
		return "cpuid-xf"
	}
	return fmt.Sprintf("data-type(%d)", uint16(d))
}

// PageDataFlags are the flags of a PAGE_DATA header.
type PageDataFlags uint32

// Page data flags.
const (
	// PageIs2MB marks a 2 MiB page; its GPA must be 2 MiB aligned.
	PageIs2MB PageDataFlags = 1 << 0
	// PageUnmeasured imports the page without measuring its contents.
	PageUnmeasured PageDataFlags = 1 << 1
	// PageShared imports the page host-visible; it is not measured.
	PageShared PageDataFlags = 1 << 2
)

// Size returns the page size these flags select.
func (f PageDataFlags) Size() uint64 {
	if f&PageIs2MB != 0 {
		return PageSize2M
	}
	return PageSize
}

// Header is one variable header. The concrete types are the structs of this
// package (*PageData, *SupportedPlatform, ...), or *Unknown for a type the
// package does not interpret.
type Header interface {
	// Type is the header's type as written in the file, optional bit
	// included.
	Type() HeaderType
}

// Masked is a header that carries a compatibility mask.
type Masked interface {
	Header
	Mask() uint32
}

// SupportedPlatform (IGVM_VHS_SUPPORTED_PLATFORM) assigns compatibility mask
// bit CompatibilityMask to a platform.
type SupportedPlatform struct {
	CompatibilityMask uint32
	HighestVTL        uint8
	PlatformType      PlatformType
	PlatformVersion   uint16
	SharedGPABoundary uint64
}

// GuestPolicy (IGVM_VHS_GUEST_POLICY) is the platform's guest policy; for
// SEV-SNP the SNP guest policy, for TDX the TD attributes policy.
type GuestPolicy struct {
	Policy            uint64
	CompatibilityMask uint32
}

// RelocatableRegion (IGVM_VHS_RELOCATABLE_REGION) marks a region the loader
// may move.
type RelocatableRegion struct {
	CompatibilityMask   uint32
	VPIndex             uint16
	VTL                 uint8
	Flags               uint8
	RelocationAlignment uint64
	RegionGPA           uint64
	RegionSize          uint64
	MinimumGPA          uint64
	MaximumGPA          uint64
}

// PageTableRelocation (IGVM_VHS_PAGE_TABLE_RELOCATION) describes the
// relocatable page table region.
type PageTableRelocation struct {
	CompatibilityMask uint32
	VPIndex           uint16
	VTL               uint8
	GPA               uint64
	Size              uint64
	UsedSize          uint64
}

// CCAPolicy (IGVM_VHS_CCA_POLICY) is the Arm CCA realm policy.
type CCAPolicy struct {
	CompatibilityMask        uint32
	AttributesRequiredZeroes uint64
	AttributesRequiredOnes   uint64
	HashAlgorithm            uint8
	LFAPolicy                uint8
}

// CorimData (IGVM_VHS_CORIM_DATA) is a CoRIM document or its signature.
type CorimData struct {
	Kind              HeaderType // TypeCorimDocument or TypeCorimSignature
	CompatibilityMask uint32
	FileOffset        uint32 // set by Parse; Marshal recomputes it
	Data              []byte
}

// PageData (IGVM_VHS_PAGE_DATA) loads one page at GPA. Empty Data means a
// page of zeros (file offset 0). Data shorter than the page is zero-padded;
// Parse returns the 4 KiB the file holds at FileOffset.
type PageData struct {
	GPA               uint64
	CompatibilityMask uint32
	FileOffset        uint32 // set by Parse; Marshal recomputes it
	Flags             PageDataFlags
	DataType          PageDataType
	Data              []byte
}

// ParameterArea (IGVM_VHS_PARAMETER_AREA) declares a parameter area that
// parameter headers write into and a PARAMETER_INSERT places in the guest.
type ParameterArea struct {
	NumberOfBytes uint64
	Index         uint32
	FileOffset    uint32 // set by Parse; Marshal recomputes it
	InitialData   []byte // empty: the area starts zeroed
}

// ParameterInsert (IGVM_VHS_PARAMETER_INSERT) imports parameter area Index
// at GPA, as unmeasured pages.
type ParameterInsert struct {
	GPA               uint64
	CompatibilityMask uint32
	Index             uint32
}

// VPContext (IGVM_VHS_VP_CONTEXT) is the initial state of virtual processor
// VPIndex; for SEV-ES and SEV-SNP, Data is the VMSA page placed at GPA.
type VPContext struct {
	GPA               uint64
	CompatibilityMask uint32
	FileOffset        uint32 // set by Parse; Marshal recomputes it
	VPIndex           uint16
	Data              []byte // one 4 KiB page as read by Parse
}

// RequiredMemory (IGVM_VHS_REQUIRED_MEMORY) is memory the guest needs.
type RequiredMemory struct {
	GPA               uint64
	CompatibilityMask uint32
	NumberOfBytes     uint32
	Flags             uint32
}

// Parameter (IGVM_VHS_PARAMETER) asks the loader to write host information
// (vCPU count, memory map, MADT, command line...) into parameter area Index
// at ByteOffset. Kind is the header type (TypeVPCount, TypeMemoryMap, ...).
type Parameter struct {
	Kind       HeaderType
	Index      uint32
	ByteOffset uint32
}

// SNPSignature is an ECDSA signature as laid out in the SNP ID block.
type SNPSignature struct {
	R [72]byte
	S [72]byte
}

// SNPPublicKey is an ECDSA public key as laid out in the SNP ID block.
type SNPPublicKey struct {
	Curve uint32
	QX    [72]byte
	QY    [72]byte
}

// SNPIDBlock (IGVM_VHS_SNP_ID_BLOCK) is the SEV-SNP ID block; LD is the
// expected launch digest.
type SNPIDBlock struct {
	CompatibilityMask  uint32
	AuthorKeyEnabled   uint8
	LD                 [48]byte
	FamilyID           [16]byte
	ImageID            [16]byte
	Version            uint32
	GuestSVN           uint32
	IDKeyAlgorithm     uint32
	AuthorKeyAlgorithm uint32
	IDKeySignature     SNPSignature
	IDPublicKey        SNPPublicKey
	AuthorKeySignature SNPSignature
	AuthorPublicKey    SNPPublicKey
}

// ErrorRange (IGVM_VHS_ERROR_RANGE) is a host-visible range for guest error
// reports.
type ErrorRange struct {
	GPA               uint64
	CompatibilityMask uint32
	SizeBytes         uint32
}

// VBSMeasurement (IGVM_VHS_VBS_MEASUREMENT) is a signed VBS boot
// measurement. Body is the structure after the compatibility mask.
type VBSMeasurement struct {
	CompatibilityMask uint32
	Body              []byte
}

// Unknown is a header of a type this package does not interpret (only
// accepted by Parse when its optional bit is set). Body is the header's
// value, without the type/length prefix and padding.
type Unknown struct {
	HeaderType HeaderType
	Body       []byte
}

// Type implementations.

func (*SupportedPlatform) Type() HeaderType   { return TypeSupportedPlatform }
func (*GuestPolicy) Type() HeaderType         { return TypeGuestPolicy }
func (*RelocatableRegion) Type() HeaderType   { return TypeRelocatableRegion }
func (*PageTableRelocation) Type() HeaderType { return TypePageTableRelocation }
func (*CCAPolicy) Type() HeaderType           { return TypeCCAPolicy }
func (h *CorimData) Type() HeaderType         { return h.Kind }
func (*PageData) Type() HeaderType            { return TypePageData }
func (*ParameterArea) Type() HeaderType       { return TypeParameterArea }
func (*ParameterInsert) Type() HeaderType     { return TypeParameterInsert }
func (*VPContext) Type() HeaderType           { return TypeVPContext }
func (*RequiredMemory) Type() HeaderType      { return TypeRequiredMemory }
func (h *Parameter) Type() HeaderType         { return h.Kind }
func (*SNPIDBlock) Type() HeaderType          { return TypeSNPIDBlock }
func (*ErrorRange) Type() HeaderType          { return TypeErrorRange }
func (*VBSMeasurement) Type() HeaderType      { return TypeVBSMeasurement }
func (h *Unknown) Type() HeaderType           { return h.HeaderType }

// Mask implementations.

func (h *SupportedPlatform) Mask() uint32   { return h.CompatibilityMask }
func (h *GuestPolicy) Mask() uint32         { return h.CompatibilityMask }
func (h *RelocatableRegion) Mask() uint32   { return h.CompatibilityMask }
func (h *PageTableRelocation) Mask() uint32 { return h.CompatibilityMask }
func (h *CCAPolicy) Mask() uint32           { return h.CompatibilityMask }
func (h *CorimData) Mask() uint32           { return h.CompatibilityMask }
func (h *PageData) Mask() uint32            { return h.CompatibilityMask }
func (h *ParameterInsert) Mask() uint32     { return h.CompatibilityMask }
func (h *VPContext) Mask() uint32           { return h.CompatibilityMask }
func (h *RequiredMemory) Mask() uint32      { return h.CompatibilityMask }
func (h *SNPIDBlock) Mask() uint32          { return h.CompatibilityMask }
func (h *ErrorRange) Mask() uint32          { return h.CompatibilityMask }
func (h *VBSMeasurement) Mask() uint32      { return h.CompatibilityMask }

// File is a parsed IGVM file.
type File struct {
	// FormatVersion is 1 or 2.
	FormatVersion uint32
	// Architecture and PageSize are the version 2 fixed header fields
	// (0 = x64; the page size must be 4096).
	Architecture uint32
	PageSize     uint32

	Platform       []Header
	Initialization []Header
	Directives     []Header
}

// Platforms returns the file's SUPPORTED_PLATFORM headers.
func (f *File) Platforms() []*SupportedPlatform {
	var out []*SupportedPlatform
	for _, h := range f.Platform {
		if p, ok := h.(*SupportedPlatform); ok {
			out = append(out, p)
		}
	}
	return out
}

// PlatformMask returns the compatibility mask the file assigns to platform
// p, or an error naming the platforms it does support.
func (f *File) PlatformMask(p PlatformType) (uint32, error) {
	var have []string
	for _, sp := range f.Platforms() {
		if sp.PlatformType == p {
			return sp.CompatibilityMask, nil
		}
		have = append(have, sp.PlatformType.String())
	}
	return 0, fmt.Errorf("igvm: the file has no SUPPORTED_PLATFORM header for %s (it supports %v)", p, have)
}

// Applies reports whether header h applies to the platform with
// compatibility mask mask. Headers without a mask apply to every platform.
func Applies(h Header, mask uint32) bool {
	m, ok := h.(Masked)
	if !ok {
		return true
	}
	return m.Mask()&mask != 0
}

// Filter returns the headers of hs that apply to mask.
func Filter(hs []Header, mask uint32) []Header {
	var out []Header
	for _, h := range hs {
		if Applies(h, mask) {
			out = append(out, h)
		}
	}
	return out
}
