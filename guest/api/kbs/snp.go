package kbs

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/uuid"
)

// SNPEvidence is the primary evidence of the snp TEE as Trustee's SNP
// verifier deserializes it (deps/verifier/src/snp: SnpEvidence) and
// guest-components' SNP attester produces it: the ATTESTATION_REPORT as
// the virtee/sev crate's AttestationReport serializes with serde_json, and
// the extended report's certificate table as a list of CertTableEntry.
// Byte arrays are JSON arrays of numbers, as serde writes [u8; N] and
// Vec<u8>.
type SNPEvidence struct {
	AttestationReport SNPReport `json:"attestation_report"`
	// CertChain is null when the host supplied no certificates (the
	// verifier then fetches the VCEK from AMD's KDS).
	CertChain []CertTableEntry `json:"cert_chain"`
}

// SNPReport is sev's AttestationReport (virtee/sev 7.1, the revision
// Trustee pins): every field of the SEV-SNP ABI's ATTESTATION_REPORT
// except the reserved ones, in its order. Options are null when the
// report's version has no such field (CPUID before version 3, the
// mitigation vectors before version 5).
type SNPReport struct {
	Version          uint32     `json:"version"`
	GuestSVN         uint32     `json:"guest_svn"`
	Policy           uint64     `json:"policy"`
	FamilyID         [16]byte   `json:"family_id"`
	ImageID          [16]byte   `json:"image_id"`
	VMPL             uint32     `json:"vmpl"`
	SigAlgo          uint32     `json:"sig_algo"`
	CurrentTCB       TCBVersion `json:"current_tcb"`
	PlatInfo         uint64     `json:"plat_info"`
	KeyInfo          uint32     `json:"key_info"`
	ReportData       [64]byte   `json:"report_data"`
	Measurement      [48]byte   `json:"measurement"`
	HostData         [32]byte   `json:"host_data"`
	IDKeyDigest      [48]byte   `json:"id_key_digest"`
	AuthorKeyDigest  [48]byte   `json:"author_key_digest"`
	ReportID         [32]byte   `json:"report_id"`
	ReportIDMA       [32]byte   `json:"report_id_ma"`
	ReportedTCB      TCBVersion `json:"reported_tcb"`
	CPUIDFamID       *uint8     `json:"cpuid_fam_id"`
	CPUIDModID       *uint8     `json:"cpuid_mod_id"`
	CPUIDStep        *uint8     `json:"cpuid_step"`
	ChipID           [64]byte   `json:"chip_id"`
	CommittedTCB     TCBVersion `json:"committed_tcb"`
	Current          FWVersion  `json:"current"`
	Committed        FWVersion  `json:"committed"`
	LaunchTCB        TCBVersion `json:"launch_tcb"`
	LaunchMitVector  *uint64    `json:"launch_mit_vector"`
	CurrentMitVector *uint64    `json:"current_mit_vector"`
	Signature        Signature  `json:"signature"`
}

// TCBVersion is sev's TcbVersion: FMC is set only on Turin and later.
type TCBVersion struct {
	FMC        *uint8 `json:"fmc"`
	Bootloader uint8  `json:"bootloader"`
	TEE        uint8  `json:"tee"`
	SNP        uint8  `json:"snp"`
	Microcode  uint8  `json:"microcode"`
}

// FWVersion is sev's Version (of the SNP firmware).
type FWVersion struct {
	Major uint8 `json:"major"`
	Minor uint8 `json:"minor"`
	Build uint8 `json:"build"`
}

// Signature is the report's ECDSA P-384 signature, R and S little endian
// and zero-extended to 72 bytes, as in the report.
type Signature struct {
	R [72]byte `json:"r"`
	S [72]byte `json:"s"`
}

// CertTableEntry is sev's CertTableEntry: a certificate of the extended
// report and its type.
type CertTableEntry struct {
	CertType CertType `json:"cert_type"`
	Data     Bytes    `json:"data"`
}

// Bytes is a byte string that JSON carries as an array of numbers (serde's
// Vec<u8>), not as base64.
type Bytes []byte

// MarshalJSON implements json.Marshaler.
func (b Bytes) MarshalJSON() ([]byte, error) {
	if b == nil {
		return []byte("[]"), nil
	}
	var out bytes.Buffer
	out.Grow(4 * len(b))
	out.WriteByte('[')
	for i, c := range b {
		if i > 0 {
			out.WriteByte(',')
		}
		out.WriteString(strconv.Itoa(int(c)))
	}
	out.WriteByte(']')
	return out.Bytes(), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	// encoding/json would read a []uint8 as base64: decode numbers.
	var ints []int
	if err := json.Unmarshal(data, &ints); err != nil {
		return fmt.Errorf("kbs: want an array of byte values: %w", err)
	}
	v := make([]uint8, len(ints))
	for i, n := range ints {
		if n < 0 || n > 255 {
			return fmt.Errorf("kbs: element %d is %d, not a byte", i, n)
		}
		v[i] = uint8(n)
	}
	*b = v
	return nil
}

// CertType is sev's CertType: "ARK", "ASK", "VCEK", "VLEK", "CRL",
// "Empty", or {"OTHER": GUID} for any other table GUID.
type CertType struct {
	// Name is one of the names above, or "OTHER".
	Name string
	// GUID is set for OTHER.
	GUID uuid.UUID
}

// The GUIDs of the certificate table (SEV-SNP ABI / GHCB specification),
// by sev's CertType name.
var certGUIDs = map[string]string{
	"Empty": "00000000-0000-0000-0000-000000000000",
	"ARK":   "c0b406a4-a803-4952-9743-3fb6014cd0ae",
	"ASK":   "4ab7b379-bbac-4fe4-a02f-05aef327c782",
	"VCEK":  "63da758d-e664-4564-adc5-f4b93be8accd",
	"VLEK":  "a8074bc2-a25a-483e-aae6-39c045a0b8a1",
	"CRL":   "92f81bc3-5811-4d3d-97ff-d19f88dc67ea",
}

// CertTypeOf names the certificate table GUID g.
func CertTypeOf(g uuid.UUID) CertType {
	for name, s := range certGUIDs {
		if g.String() == s {
			return CertType{Name: name}
		}
	}
	return CertType{Name: "OTHER", GUID: g}
}

// UUID returns the table GUID of t.
func (t CertType) UUID() (uuid.UUID, error) {
	if t.Name == "OTHER" {
		return t.GUID, nil
	}
	s, ok := certGUIDs[t.Name]
	if !ok {
		return uuid.UUID{}, fmt.Errorf("kbs: certificate type %q is not one of ARK, ASK, VCEK, VLEK, CRL, Empty, OTHER", t.Name)
	}
	return uuid.MustParse(s), nil
}

// MarshalJSON implements json.Marshaler (serde's externally tagged enum).
func (t CertType) MarshalJSON() ([]byte, error) {
	if t.Name == "OTHER" {
		return json.Marshal(map[string]string{"OTHER": t.GUID.String()})
	}
	if _, err := t.UUID(); err != nil {
		return nil, err
	}
	return json.Marshal(t.Name)
}

// UnmarshalJSON implements json.Unmarshaler.
func (t *CertType) UnmarshalJSON(data []byte) error {
	var name string
	if json.Unmarshal(data, &name) == nil {
		c := CertType{Name: name}
		if _, err := c.UUID(); err != nil {
			return err
		}
		*t = c
		return nil
	}
	var other map[string]string
	if err := json.Unmarshal(data, &other); err != nil || len(other) != 1 || other["OTHER"] == "" {
		return fmt.Errorf("kbs: certificate type %s: want a name or {\"OTHER\": GUID}", data)
	}
	g, err := uuid.Parse(other["OTHER"])
	if err != nil {
		return fmt.Errorf("kbs: certificate type: %w", err)
	}
	*t = CertType{Name: "OTHER", GUID: g}
	return nil
}

// Processor generations, as sev tells them apart for the TCB layout.
const (
	genMilan = "Milan"
	genGenoa = "Genoa"
	genTurin = "Turin"
)

// generation identifies the processor from the report's CPUID family and
// model (sev's Generation::identify_cpu).
func generation(family, model uint8) (string, error) {
	switch {
	case family == 0x19 && model <= 0x0F:
		return genMilan, nil
	case family == 0x19 && (model >= 0x10 && model <= 0x1F || model >= 0xA0 && model <= 0xAF):
		return genGenoa, nil
	case family == 0x1A && model <= 0x11:
		return genTurin, nil
	}
	return "", fmt.Errorf("kbs: SNP report from CPU family %#x model %#x: not a Milan, Genoa or Turin processor", family, model)
}

// SNPProductLine is the AMD product line ("Milan", "Genoa", "Turin": the
// product name of AMD's KDS, whose ARK and ASK certify the chip's VCEK) of
// an SEV-SNP processor of CPUID family and model, as a version 3 or later
// ATTESTATION_REPORT carries them (CPUID_FAM_ID, CPUID_MOD_ID). Siena and
// Bergamo (family 19h, models A0h-AFh) are Genoa-line: AMD's VCEK/KDS
// specification (57230) has them use Genoa's ARK and ASK. This table is
// c8s's one home for these facts; launcher/attest verifies with it.
func SNPProductLine(family, model uint8) (string, error) { return generation(family, model) }

// SNPTCB reads a TCB_VERSION (the 8 bytes of a report's TCB field) in the
// layout of productLine: Turin and later put an FMC security patch level
// first and move the SNP level (FMC, bootloader, TEE, SNP, 3 reserved
// bytes, microcode); Milan and Genoa have bootloader, TEE, 4 reserved
// bytes, SNP, microcode. Reserved bytes are dropped.
func SNPTCB(b []byte, productLine string) TCBVersion { return tcbFromBytes(b, productLine) }

// reportGeneration is the generation of a report: from CPUID for version 3
// and later, from the shape of CHIP_ID for version 2 (Turin's is 8 bytes).
func reportGeneration(version uint32, family, model uint8, chipID []byte) (string, error) {
	if version == 2 {
		if bytes.Equal(chipID, make([]byte, 64)) {
			return "", errors.New("kbs: SNP report version 2 with a masked CHIP_ID: the processor generation cannot be told")
		}
		if bytes.Equal(chipID[8:], make([]byte, 56)) {
			return genTurin, nil
		}
		return genGenoa, nil
	}
	return generation(family, model)
}

func tcbFromBytes(b []byte, gen string) TCBVersion {
	if gen == genTurin {
		fmc := b[0]
		return TCBVersion{FMC: &fmc, Bootloader: b[1], TEE: b[2], SNP: b[3], Microcode: b[7]}
	}
	return TCBVersion{Bootloader: b[0], TEE: b[1], SNP: b[6], Microcode: b[7]}
}

func (t TCBVersion) bytes(gen string) []byte {
	if gen == genTurin {
		var fmc uint8
		if t.FMC != nil {
			fmc = *t.FMC
		}
		return []byte{fmc, t.Bootloader, t.TEE, t.SNP, 0, 0, 0, t.Microcode}
	}
	return []byte{t.Bootloader, t.TEE, 0, 0, 0, 0, t.SNP, t.Microcode}
}

// ParseSNPReport reads a raw ATTESTATION_REPORT (abi.ReportSize bytes) the
// way sev's AttestationReport decoder does; reserved bytes are dropped.
func ParseSNPReport(raw []byte) (*SNPReport, error) {
	if len(raw) != abi.ReportSize {
		return nil, fmt.Errorf("kbs: SNP report of %d bytes, want %d", len(raw), abi.ReportSize)
	}
	le := binary.LittleEndian
	r := &SNPReport{Version: le.Uint32(raw[0x00:])}
	if r.Version < 2 {
		return nil, fmt.Errorf("kbs: SNP report version %d is not supported (2 or later)", r.Version)
	}
	gen, err := reportGeneration(r.Version, raw[0x188], raw[0x189], raw[0x1A0:0x1E0])
	if err != nil {
		return nil, err
	}
	r.GuestSVN = le.Uint32(raw[0x04:])
	r.Policy = le.Uint64(raw[0x08:])
	copy(r.FamilyID[:], raw[0x10:])
	copy(r.ImageID[:], raw[0x20:])
	r.VMPL = le.Uint32(raw[0x30:])
	r.SigAlgo = le.Uint32(raw[0x34:])
	r.CurrentTCB = tcbFromBytes(raw[0x38:0x40], gen)
	r.PlatInfo = le.Uint64(raw[0x40:])
	r.KeyInfo = le.Uint32(raw[0x48:])
	copy(r.ReportData[:], raw[0x50:])
	copy(r.Measurement[:], raw[0x90:])
	copy(r.HostData[:], raw[0xC0:])
	copy(r.IDKeyDigest[:], raw[0xE0:])
	copy(r.AuthorKeyDigest[:], raw[0x110:])
	copy(r.ReportID[:], raw[0x140:])
	copy(r.ReportIDMA[:], raw[0x160:])
	r.ReportedTCB = tcbFromBytes(raw[0x180:0x188], gen)
	if r.Version >= 3 {
		fam, mod, step := raw[0x188], raw[0x189], raw[0x18A]
		r.CPUIDFamID, r.CPUIDModID, r.CPUIDStep = &fam, &mod, &step
	}
	copy(r.ChipID[:], raw[0x1A0:])
	r.CommittedTCB = tcbFromBytes(raw[0x1E0:0x1E8], gen)
	r.Current = FWVersion{Build: raw[0x1E8], Minor: raw[0x1E9], Major: raw[0x1EA]}
	r.Committed = FWVersion{Build: raw[0x1EC], Minor: raw[0x1ED], Major: raw[0x1EE]}
	r.LaunchTCB = tcbFromBytes(raw[0x1F0:0x1F8], gen)
	if r.Version >= 5 {
		l, c := le.Uint64(raw[0x1F8:]), le.Uint64(raw[0x200:])
		r.LaunchMitVector, r.CurrentMitVector = &l, &c
	}
	copy(r.Signature.R[:], raw[0x2A0:])
	copy(r.Signature.S[:], raw[0x2E8:])
	return r, nil
}

// Marshal writes the report back into its ABI layout, as sev's encoder
// does before checking the signature: reserved bytes are zero, so a report
// whose reserved bytes were not will not verify.
func (r *SNPReport) Marshal() ([]byte, error) {
	if r.Version < 2 {
		return nil, fmt.Errorf("kbs: SNP report version %d is not supported (2 or later)", r.Version)
	}
	var fam, mod uint8
	if r.CPUIDFamID != nil {
		fam = *r.CPUIDFamID
	}
	if r.CPUIDModID != nil {
		mod = *r.CPUIDModID
	}
	gen, err := reportGeneration(r.Version, fam, mod, r.ChipID[:])
	if err != nil {
		return nil, err
	}
	raw := make([]byte, abi.ReportSize)
	le := binary.LittleEndian
	le.PutUint32(raw[0x00:], r.Version)
	le.PutUint32(raw[0x04:], r.GuestSVN)
	le.PutUint64(raw[0x08:], r.Policy)
	copy(raw[0x10:], r.FamilyID[:])
	copy(raw[0x20:], r.ImageID[:])
	le.PutUint32(raw[0x30:], r.VMPL)
	le.PutUint32(raw[0x34:], r.SigAlgo)
	copy(raw[0x38:], r.CurrentTCB.bytes(gen))
	le.PutUint64(raw[0x40:], r.PlatInfo)
	le.PutUint32(raw[0x48:], r.KeyInfo)
	copy(raw[0x50:], r.ReportData[:])
	copy(raw[0x90:], r.Measurement[:])
	copy(raw[0xC0:], r.HostData[:])
	copy(raw[0xE0:], r.IDKeyDigest[:])
	copy(raw[0x110:], r.AuthorKeyDigest[:])
	copy(raw[0x140:], r.ReportID[:])
	copy(raw[0x160:], r.ReportIDMA[:])
	copy(raw[0x180:], r.ReportedTCB.bytes(gen))
	if r.Version >= 3 {
		raw[0x188], raw[0x189] = fam, mod
		if r.CPUIDStep != nil {
			raw[0x18A] = *r.CPUIDStep
		}
	}
	copy(raw[0x1A0:], r.ChipID[:])
	copy(raw[0x1E0:], r.CommittedTCB.bytes(gen))
	raw[0x1E8], raw[0x1E9], raw[0x1EA] = r.Current.Build, r.Current.Minor, r.Current.Major
	raw[0x1EC], raw[0x1ED], raw[0x1EE] = r.Committed.Build, r.Committed.Minor, r.Committed.Major
	copy(raw[0x1F0:], r.LaunchTCB.bytes(gen))
	if r.Version >= 5 {
		if r.LaunchMitVector != nil {
			le.PutUint64(raw[0x1F8:], *r.LaunchMitVector)
		}
		if r.CurrentMitVector != nil {
			le.PutUint64(raw[0x200:], *r.CurrentMitVector)
		}
	}
	copy(raw[0x2A0:], r.Signature.R[:])
	copy(raw[0x2E8:], r.Signature.S[:])
	return raw, nil
}

// CertChain turns an extended report's certificate table (GUID table) into
// sev's entries, in table order; an empty table gives nil (cert_chain
// null).
func CertChain(table []byte) ([]CertTableEntry, error) {
	if len(table) == 0 {
		return nil, nil
	}
	var t abi.CertTable
	if err := t.Unmarshal(table); err != nil {
		return nil, fmt.Errorf("kbs: SNP certificate table: %w", err)
	}
	if len(t.Entries) == 0 {
		return nil, nil
	}
	out := make([]CertTableEntry, 0, len(t.Entries))
	for _, e := range t.Entries {
		out = append(out, CertTableEntry{CertType: CertTypeOf(e.GUID), Data: Bytes(e.RawCert)})
	}
	return out, nil
}

// CertTable turns sev's entries back into a GUID table; nil entries give
// nil.
func CertTable(chain []CertTableEntry) ([]byte, error) {
	if len(chain) == 0 {
		return nil, nil
	}
	t := abi.CertTable{}
	for _, e := range chain {
		g, err := e.CertType.UUID()
		if err != nil {
			return nil, err
		}
		t.Entries = append(t.Entries, abi.CertTableEntry{GUID: g, RawCert: e.Data})
	}
	return t.Marshal(), nil
}

// NewSNPEvidence builds the snp primary evidence from a raw report and the
// certificate table that came with it.
func NewSNPEvidence(report, certTable []byte) (*SNPEvidence, error) {
	r, err := ParseSNPReport(report)
	if err != nil {
		return nil, err
	}
	chain, err := CertChain(certTable)
	if err != nil {
		return nil, err
	}
	return &SNPEvidence{AttestationReport: *r, CertChain: chain}, nil
}

// Raw returns the report and the certificate table the evidence carries,
// in their ABI forms.
func (e *SNPEvidence) Raw() (report, certTable []byte, err error) {
	if report, err = e.AttestationReport.Marshal(); err != nil {
		return nil, nil, err
	}
	if certTable, err = CertTable(e.CertChain); err != nil {
		return nil, nil, err
	}
	return report, certTable, nil
}
