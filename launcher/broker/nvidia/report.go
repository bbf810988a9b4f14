// Package nvidia verifies an NVIDIA GPU's attestation report, the device
// evidence a confidential pod sends its key broker beside the CPU's (the
// KBS protocol's additional evidence, key "nvidia", in the shape Trustee's
// NVIDIA verifier reads: {"device_evidence_list": [{"arch", "uuid",
// "evidence", "certificate"}]}).
//
// A report is what NVIDIA's attestation SDK collects from a GPU in CC mode:
// the SPDM 1.1 GET_MEASUREMENTS request the driver sent (with the
// verifier's 32-byte nonce) followed by the GPU's response (the
// measurement blocks, the nonce, NVIDIA's opaque data, and an ECDSA P-384
// signature over request and response). The certificate is the GPU's
// device certificate chain, PEM, leaf first, ending in NVIDIA's device
// identity root CA. Verify checks, in this order: the chain up to the
// pinned NVIDIA root; that the leaf's FWID (the TCG DICE extension
// 2.23.133.5.4.1, its last 48 bytes) is the report's opaque FWID; the
// report's signature with the leaf's key; and that the request's nonce is
// the one the broker expects (so a report is fresh and bound to the
// session). It then returns the measurements and the driver and VBIOS
// versions as claims, for the owner's policy to compare with reference
// values.
//
// Verified locally: Hopper reports (signature length 96). Blackwell and
// NVSwitch (LS10) reports differ in layout and are refused; NVIDIA's remote
// service (NRAS) is not used. Both are left to a GPUVerifier of the
// broker's choosing (launcher/broker, gpu.go). The tests use genuine
// public Hopper reports and chains from Trustee's test data
// (testdata/NOTICE).
package nvidia

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
)

// SPDM constants (DMTF DSP0274 1.1).
const (
	spdmVersion11      = 0x11
	spdmGetMeasurement = 0xe0
	spdmMeasurements   = 0x60
	dmtfMeasurement    = 0x01 // MeasurementSpecification: DMTF
	// NonceSize is the SPDM nonce.
	NonceSize = 32
	// requestSize is a GET_MEASUREMENTS request with a nonce: header (4),
	// nonce (32), SlotIDParam (1).
	requestSize = 4 + NonceSize + 1
	// HopperSignatureSize is a raw ECDSA P-384 signature (r || s).
	HopperSignatureSize = 96
)

// Opaque data types of NVIDIA's GET_MEASUREMENTS response (as named in
// NVIDIA's nvtrust verifier; Trustee uses the same numbers).
const (
	opaqueDriverVersion = 3
	opaqueVBIOSVersion  = 6
	opaqueFWID          = 20
)

// Measurement is one DMTF measurement block.
type Measurement struct {
	Index uint8
	// Type is the DMTF measurement value type.
	Type  uint8
	Value []byte
}

// Report is a parsed attestation report.
type Report struct {
	// Nonce is the request's nonce, which the verifier chose.
	Nonce [NonceSize]byte
	// ResponseNonce is the GPU's own nonce in the response.
	ResponseNonce [NonceSize]byte
	Measurements  []Measurement
	// Opaque is NVIDIA's opaque data, by type.
	Opaque map[uint16][]byte
	// Signature is the raw signature; Signed the bytes it covers (the
	// request and the response up to the signature).
	Signature []byte
	Signed    []byte
}

// ParseReport parses a report whose signature is sigSize bytes.
func ParseReport(b []byte, sigSize int) (*Report, error) {
	if len(b) < requestSize+8 {
		return nil, fmt.Errorf("nvidia report: %d bytes, too short for an SPDM request and response", len(b))
	}
	req, resp := b[:requestSize], b[requestSize:]
	if req[0] != spdmVersion11 || req[1] != spdmGetMeasurement {
		return nil, fmt.Errorf("nvidia report: the request is SPDM version %#x code %#x, want GET_MEASUREMENTS (%#x) of SPDM 1.1", req[0], req[1], spdmGetMeasurement)
	}
	r := &Report{Opaque: map[uint16][]byte{}}
	copy(r.Nonce[:], req[4:4+NonceSize])
	if resp[0] != spdmVersion11 || resp[1] != spdmMeasurements {
		return nil, fmt.Errorf("nvidia report: the response is SPDM version %#x code %#x, want MEASUREMENTS (%#x) of SPDM 1.1", resp[0], resp[1], spdmMeasurements)
	}
	blocks := int(resp[4])
	recLen := int(resp[5]) | int(resp[6])<<8 | int(resp[7])<<16
	off := 8
	rec, err := take(resp, &off, recLen, "measurement record")
	if err != nil {
		return nil, err
	}
	if r.Measurements, err = parseRecord(rec, blocks); err != nil {
		return nil, err
	}
	nonce, err := take(resp, &off, NonceSize, "response nonce")
	if err != nil {
		return nil, err
	}
	copy(r.ResponseNonce[:], nonce)
	lb, err := take(resp, &off, 2, "opaque data length")
	if err != nil {
		return nil, err
	}
	opaque, err := take(resp, &off, int(binary.LittleEndian.Uint16(lb)), "opaque data")
	if err != nil {
		return nil, err
	}
	if err := r.parseOpaque(opaque); err != nil {
		return nil, err
	}
	signedLen := requestSize + off
	if r.Signature, err = take(resp, &off, sigSize, "signature"); err != nil {
		return nil, err
	}
	// What the SDK collects may end in zero padding after the signature
	// (the Confidential Containers CI sample has one byte); anything else
	// there is not part of a report.
	if len(bytes.Trim(resp[off:], "\x00")) != 0 {
		return nil, fmt.Errorf("nvidia report: %d bytes after the signature that are not zero padding", len(resp)-off)
	}
	r.Signed = b[:signedLen]
	return r, nil
}

// take returns the next n bytes of b at *off.
func take(b []byte, off *int, n int, what string) ([]byte, error) {
	if n < 0 || *off+n > len(b) {
		return nil, fmt.Errorf("nvidia report: the %s (%d bytes at %d) runs past the end (%d bytes)", what, n, *off, len(b))
	}
	out := b[*off : *off+n]
	*off += n
	return out, nil
}

// parseRecord parses n measurement blocks: index, specification, size
// (LE16), then a DMTF measurement: type, value size (LE16), value.
func parseRecord(rec []byte, n int) ([]Measurement, error) {
	var out []Measurement
	off := 0
	for i := 0; i < n; i++ {
		hdr, err := take(rec, &off, 4, "measurement block header")
		if err != nil {
			return nil, err
		}
		if hdr[1] != dmtfMeasurement {
			return nil, fmt.Errorf("nvidia report: measurement block %d is not in the DMTF format (specification %#x)", hdr[0], hdr[1])
		}
		body, err := take(rec, &off, int(binary.LittleEndian.Uint16(hdr[2:])), "measurement block")
		if err != nil {
			return nil, err
		}
		if len(body) < 3 {
			return nil, fmt.Errorf("nvidia report: measurement block %d is %d bytes", hdr[0], len(body))
		}
		size := int(binary.LittleEndian.Uint16(body[1:]))
		if 3+size != len(body) {
			return nil, fmt.Errorf("nvidia report: measurement block %d says %d value bytes in %d", hdr[0], size, len(body)-3)
		}
		out = append(out, Measurement{Index: hdr[0], Type: body[0], Value: body[3:]})
	}
	if off != len(rec) {
		return nil, fmt.Errorf("nvidia report: %d bytes after %d measurement blocks", len(rec)-off, n)
	}
	return out, nil
}

// parseOpaque parses the opaque data: type (LE16), size (LE16), data.
func (r *Report) parseOpaque(b []byte) error {
	off := 0
	for off < len(b) {
		hdr, err := take(b, &off, 4, "opaque data item header")
		if err != nil {
			return err
		}
		typ := binary.LittleEndian.Uint16(hdr)
		data, err := take(b, &off, int(binary.LittleEndian.Uint16(hdr[2:])), "opaque data item")
		if err != nil {
			return err
		}
		if _, dup := r.Opaque[typ]; dup {
			return fmt.Errorf("nvidia report: opaque data type %d twice", typ)
		}
		r.Opaque[typ] = data
	}
	for _, t := range []uint16{opaqueDriverVersion, opaqueVBIOSVersion, opaqueFWID} {
		if _, ok := r.Opaque[t]; !ok {
			return fmt.Errorf("nvidia report: the opaque data has no type %d (driver version 3, VBIOS version 6 and FWID 20 are required)", t)
		}
	}
	return nil
}

// DriverVersion is the guest driver's version the GPU reports.
func (r *Report) DriverVersion() string {
	return strings.TrimRight(string(r.Opaque[opaqueDriverVersion]), "\x00")
}

// VBIOSVersion is the VBIOS version in NVIDIA's notation (the first half
// of the bytes reversed, then the first byte of the second half, each as
// two hex digits, dot-separated: 96.00.9f.00.01).
func (r *Report) VBIOSVersion() string {
	b := r.Opaque[opaqueVBIOSVersion]
	if len(b) < 2 {
		return hex.EncodeToString(b)
	}
	var parts []string
	for i := len(b)/2 - 1; i >= 0; i-- {
		parts = append(parts, fmt.Sprintf("%02x", b[i]))
	}
	return strings.Join(append(parts, fmt.Sprintf("%02x", b[len(b)/2])), ".")
}

// FWID is the firmware ID the report carries.
func (r *Report) FWID() []byte { return r.Opaque[opaqueFWID] }
