// Package simtrust is what a verifier knows of c8s's `sim` TEE, apart
// from the simulated secure processor itself (launcher/vm/tee/sim): the
// marking of its certificates, the AMD product line it claims, the file
// of a node's state that holds its root, and the layout of the RTMR
// statements its VCEK signs. It links nothing but the standard library,
// so that the shim's evidence verifier (c8s-verify, launcher/attest) does
// not link the host side of the TEE (QEMU, ttrpc, the node config).
package simtrust

import (
	"crypto/x509"
	"encoding/asn1"
	"fmt"
)

const (
	// ProductLine is the AMD product line the simulated chip claims.
	// go-sev-guest's verifier only knows real product lines (Milan, Genoa,
	// Turin), so the simulation has to pick one; the marking below says
	// it is not AMD's.
	ProductLine = "Milan"
	// ARKCommonName is the simulated root's common name.
	ARKCommonName = "c8s SIMULATED ARK - NOT AMD - test only"
	// SimMarker is the description attribute (OID 2.5.4.13,
	// DescriptionOID) in the subject of every certificate of a simulated
	// chain.
	SimMarker = "c8s SIMULATED secure processor - NOT AMD - test only"
	// CertChainFile is the file in the simulated secure processor's state
	// directory that holds the ASK and the ARK, PEM, in the order of AMD's
	// KDS cert_chain endpoint: the trust anchor a sim-mode verifier is
	// configured with.
	CertChainFile = "cert_chain.pem"
)

// DescriptionOID is the X.520 description attribute that carries
// SimMarker.
var DescriptionOID = asn1.ObjectIdentifier{2, 5, 4, 13}

// IsSimulated reports whether cert carries the simulation marker: its
// subject description is SimMarker or it is named ARKCommonName.
func IsSimulated(cert *x509.Certificate) bool {
	if cert == nil {
		return false
	}
	if cert.Subject.CommonName == ARKCommonName || cert.Issuer.CommonName == ARKCommonName {
		return true
	}
	for _, n := range cert.Subject.Names {
		if n.Type.Equal(DescriptionOID) {
			if s, ok := n.Value.(string); ok && s == SimMarker {
				return true
			}
		}
	}
	return false
}

// RTMRStatementMagic starts every RTMR statement.
const RTMRStatementMagic = "c8s sim RTMRs v1"

// RTMRSignedSize is the signed part of an RTMR statement: the magic, the
// SHA-384 of the report it is bound to, RTMR0-3. The VCEK's ECDSA P-384
// signature (ASN.1) over the SHA-384 of those follows.
const RTMRSignedSize = len(RTMRStatementMagic) + 48 + 4*48

// ParseRTMRStatement splits a statement into the SHA-384 of the report it
// binds, the RTMRs, the signed bytes and the signature; it verifies
// nothing.
func ParseRTMRStatement(b []byte) (reportDigest [48]byte, rtmrs [4][48]byte, signed, sig []byte, err error) {
	if len(b) <= RTMRSignedSize || string(b[:len(RTMRStatementMagic)]) != RTMRStatementMagic {
		return reportDigest, rtmrs, nil, nil, fmt.Errorf("sim: not an RTMR statement (%d bytes)", len(b))
	}
	p := b[len(RTMRStatementMagic):]
	copy(reportDigest[:], p)
	p = p[48:]
	for i := range rtmrs {
		copy(rtmrs[i][:], p[48*i:])
	}
	return reportDigest, rtmrs, b[:RTMRSignedSize], b[RTMRSignedSize:], nil
}
