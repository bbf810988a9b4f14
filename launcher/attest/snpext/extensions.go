package snpext

import (
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"slices"
)

// AMD's V[CL]EK extension OIDs (VCEK/KDS specification 57230) are
// 1.3.6.1.4.1.3704.1.<major>[.<minor>].
var amdOID = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 3704, 1}

// authorityKeyID may accompany the AMD extensions (the ASK is a CA).
var authorityKeyID = asn1.ObjectIdentifier{2, 5, 29, 35}

// The AMD extensions by their part after amdOID.
type amdExt struct{ major, minor int }

var (
	extStructVersion = amdExt{1, 0}
	extProductName   = amdExt{2, 0}
	extBlSPL         = amdExt{3, 1}
	extTeeSPL        = amdExt{3, 2}
	extSnpSPL        = amdExt{3, 3}
	extSpl4          = amdExt{3, 4}
	extSpl5          = amdExt{3, 5}
	extSpl6          = amdExt{3, 6}
	extSpl7          = amdExt{3, 7}
	extUcodeSPL      = amdExt{3, 8}
	// extFmcSPL (1.3.6.1.4.1.3704.1.3.9) is the FMC security patch level
	// of structure version 1 (Turin); go-sev-guest v0.15.0 rejects it.
	extFmcSPL = amdExt{3, 9}
	extHWID   = amdExt{4, 0}
	extCSPID  = amdExt{5, 0}
)

func (e amdExt) String() string {
	if e.minor == 0 {
		return fmt.Sprintf("%s.%d", amdOID, e.major)
	}
	return fmt.Sprintf("%s.%d.%d", amdOID, e.major, e.minor)
}

// Key is the endorsement key kind a certificate certifies.
type Key string

// The endorsement keys.
const (
	VCEK Key = "VCEK"
	VLEK Key = "VLEK"
)

// Extensions are the AMD extensions of a VCEK or VLEK certificate.
type Extensions struct {
	// StructVersion is 0 (Milan, Genoa) or 1 (Turin).
	StructVersion uint8
	// ProductName is e.g. "Milan-B0", "Genoa", "Turin" (VCEK) or the bare
	// product line (VLEK).
	ProductName string
	// HWID is the chip's hardware id (VCEK only): 64 bytes in structure
	// version 0, 8 in version 1.
	HWID []byte
	// CSPID names the cloud provider a VLEK was issued to (VLEK only).
	CSPID string
	// TCB is the TCB the key is certified for.
	TCB TCB
}

// HWIDSize is the size of a VCEK's HWID in structure version v.
func HWIDSize(v uint8) int {
	if v == 1 {
		return 8
	}
	return 64
}

// StructVersion is the extension structure version AMD's KDS issues for
// line's certificates.
func StructVersion(line string) uint8 {
	if line == Turin {
		return 1
	}
	return 0
}

// ParseExtensions reads the AMD extensions of a key certificate for line
// (the report's product line), in line's layout. It fails closed: an AMD
// extension it does not know or that line's layout lacks, a reserved
// security patch level that is not zero, an unknown structure version, a
// HWID of the wrong size or a product name of another line are errors.
func ParseExtensions(c *x509.Certificate, key Key, line string) (*Extensions, error) {
	exts := map[amdExt][]byte{}
	for _, e := range c.Extensions {
		if e.Id.Equal(authorityKeyID) {
			continue
		}
		id, ok := amdExtOf(e.Id)
		if !ok {
			return nil, fmt.Errorf("%s certificate: extension %s is not one of AMD's V[CL]EK extensions", key, e.Id)
		}
		if _, dup := exts[id]; dup {
			return nil, fmt.Errorf("%s certificate: extension %s appears twice", key, id)
		}
		exts[id] = e.Value
	}
	var out Extensions
	var err error
	if out.StructVersion, err = u8(exts, extStructVersion); err != nil {
		return nil, fmt.Errorf("%s certificate: structure version: %w", key, err)
	}
	// The product line, not the structure version, selects the layout
	// (go-sev-guest v0.15.0 does not read the version either): AMD issues
	// version 0 for Milan and Genoa and 1 for Turin, but c8s's simulated
	// secure processor wrote 1 on its Milan VCEKs, and those identities
	// persist on nodes. A version this verifier does not know is refused.
	if out.StructVersion > 1 {
		return nil, fmt.Errorf("%s certificate: extension structure version %d: this verifier knows 0 (Milan, Genoa) and 1 (Turin)", key, out.StructVersion)
	}
	if out.ProductName, err = ia5(exts[extProductName]); err != nil {
		return nil, fmt.Errorf("%s certificate: product name: %w", key, err)
	}
	pl, err := ProductLineOfName(out.ProductName)
	if err != nil || pl != line {
		return nil, fmt.Errorf("%s certificate: product name %q, but the report comes from a %s processor", key, out.ProductName, line)
	}
	if err := keyIdentity(&out, exts, key); err != nil {
		return nil, err
	}
	if out.TCB, err = certTCB(exts, line); err != nil {
		return nil, fmt.Errorf("%s certificate: %w", key, err)
	}
	return &out, nil
}

// keyIdentity reads the HWID (VCEK) or CSP_ID (VLEK).
func keyIdentity(out *Extensions, exts map[amdExt][]byte, key Key) error {
	hwid, hasHWID := exts[extHWID]
	cspid, hasCSPID := exts[extCSPID]
	switch {
	case key == VCEK && hasCSPID:
		return errors.New("VCEK certificate: it has a CSP_ID (a VLEK's extension)")
	case key == VCEK && !hasHWID:
		return errors.New("VCEK certificate: no HWID extension")
	case key == VLEK && hasHWID:
		return errors.New("VLEK certificate: it has a HWID (a VCEK's extension)")
	case key == VLEK && !hasCSPID:
		return errors.New("VLEK certificate: no CSP_ID extension")
	case key == VCEK:
		size := HWIDSize(out.StructVersion)
		b, err := octets(hwid, size)
		if err != nil {
			return fmt.Errorf("VCEK certificate: HWID: %w", err)
		}
		out.HWID = b
	default:
		s, err := ia5(cspid)
		if err != nil {
			return fmt.Errorf("VLEK certificate: CSP_ID: %w", err)
		}
		out.CSPID = s
	}
	return nil
}

// certTCB composes the certified TCB in line's layout.
func certTCB(exts map[amdExt][]byte, line string) (TCB, error) {
	t := TCB{Line: line}
	fields := []struct {
		ext amdExt
		dst *uint8
	}{{extBlSPL, &t.Bootloader}, {extTeeSPL, &t.TEE}, {extSnpSPL, &t.SNP}, {extUcodeSPL, &t.Microcode}}
	reserved := []amdExt{extSpl4, extSpl5, extSpl6, extSpl7}
	if HasFMC(line) {
		fields = append(fields, struct {
			ext amdExt
			dst *uint8
		}{extFmcSPL, &t.FMC})
		// Structure version 1 has no spl_4 (genuine Turin VCEKs carry
		// spl_5 to spl_7, zero).
		if _, ok := exts[extSpl4]; ok {
			return TCB{}, fmt.Errorf("extension %s (spl_4) is not part of a %s certificate", extSpl4, line)
		}
		reserved = reserved[1:]
	} else if _, ok := exts[extFmcSPL]; ok {
		return TCB{}, fmt.Errorf("extension %s (fmcSPL) is not part of a %s certificate", extFmcSPL, line)
	}
	for _, f := range fields {
		v, err := u8(exts, f.ext)
		if err != nil {
			return TCB{}, err
		}
		*f.dst = v
	}
	for _, r := range reserved {
		if _, ok := exts[r]; !ok {
			if HasFMC(line) {
				continue // optional in structure version 1
			}
			return TCB{}, fmt.Errorf("no extension %s (reserved security patch level)", r)
		}
		v, err := u8(exts, r)
		if err != nil {
			return TCB{}, err
		}
		if v != 0 {
			return TCB{}, fmt.Errorf("reserved security patch level %s is %d: not a TCB layout this verifier knows", r, v)
		}
	}
	return t, nil
}

func amdExtOf(id asn1.ObjectIdentifier) (amdExt, bool) {
	if len(id) < len(amdOID)+1 || len(id) > len(amdOID)+2 || !slices.Equal(id[:len(amdOID)], amdOID) {
		return amdExt{}, false
	}
	e := amdExt{major: id[len(amdOID)]}
	if len(id) == len(amdOID)+2 {
		e.minor = id[len(amdOID)+1]
	}
	known := []amdExt{extStructVersion, extProductName, extBlSPL, extTeeSPL, extSnpSPL, extSpl4, extSpl5,
		extSpl6, extSpl7, extUcodeSPL, extFmcSPL, extHWID, extCSPID}
	return e, slices.Contains(known, e)
}

// u8 reads an INTEGER extension of 0-255.
func u8(exts map[amdExt][]byte, e amdExt) (uint8, error) {
	v, ok := exts[e]
	if !ok {
		return 0, fmt.Errorf("no extension %s", e)
	}
	var i int
	rest, err := asn1.Unmarshal(v, &i)
	if err != nil || len(rest) != 0 {
		return 0, fmt.Errorf("extension %s is not a DER INTEGER", e)
	}
	if i < 0 || i > 255 {
		return 0, fmt.Errorf("extension %s is %d, not 0-255", e, i)
	}
	return uint8(i), nil
}

// ia5 reads an IA5String extension value.
func ia5(v []byte) (string, error) {
	if len(v) == 0 || v[0] != asn1.TagIA5String {
		return "", errors.New("missing, or not an IA5String")
	}
	var s string
	rest, err := asn1.UnmarshalWithParams(v, &s, "ia5")
	if err != nil || len(rest) != 0 {
		return "", errors.New("not a DER IA5String")
	}
	return s, nil
}

// octets reads the HWID: the KDS writes the raw bytes without an ASN.1
// tag; a DER OCTET STRING of the right size is accepted too.
func octets(v []byte, size int) ([]byte, error) {
	if len(v) == size {
		return v, nil
	}
	var b []byte
	rest, err := asn1.Unmarshal(v, &b)
	if err != nil || len(rest) != 0 || len(b) != size {
		return nil, fmt.Errorf("%d bytes, want %d", len(v), size)
	}
	return b, nil
}
