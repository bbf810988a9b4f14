package simtrust

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"strings"
	"testing"
)

// The statement layout the simulated secure processor signs
// (launcher/vm/tee/sim.SP.RTMRStatement): magic, SHA-384 of the report,
// RTMR0-3, then the signature. Anything shorter or with another magic is
// not a statement.
func TestParseRTMRStatement(t *testing.T) {
	b := []byte(RTMRStatementMagic)
	b = append(b, bytes.Repeat([]byte{0xaa}, 48)...)
	for i := range 4 {
		b = append(b, bytes.Repeat([]byte{byte(i + 1)}, 48)...)
	}
	b = append(b, "SIG"...)
	rd, rtmrs, signed, sig, err := ParseRTMRStatement(b)
	if err != nil || rd[0] != 0xaa || rd[47] != 0xaa || rtmrs[0][0] != 1 || rtmrs[3][47] != 4 || len(signed) != RTMRSignedSize || string(sig) != "SIG" {
		t.Fatalf("ParseRTMRStatement = %x %x %d %q %v", rd, rtmrs, len(signed), sig, err)
	}
	for name, bad := range map[string][]byte{
		"no signature":  b[:RTMRSignedSize],
		"another magic": append([]byte(strings.ToUpper(RTMRStatementMagic)), b[len(RTMRStatementMagic):]...),
		"empty":         nil,
	} {
		if _, _, _, _, err := ParseRTMRStatement(bad); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// Only the marking makes a certificate simulated: the description
// attribute or the simulated ARK's name, never AMD's names alone.
func TestIsSimulated(t *testing.T) {
	amd := pkix.Name{Organization: []string{"Advanced Micro Devices"}, CommonName: "SEV-Milan"}
	marked := amd
	marked.Names = append(marked.Names, pkix.AttributeTypeAndValue{Type: DescriptionOID, Value: SimMarker})
	for name, c := range map[string]struct {
		cert *x509.Certificate
		want bool
	}{
		"nil":                 {nil, false},
		"AMD's":               {&x509.Certificate{Subject: amd, Issuer: amd}, false},
		"marked":              {&x509.Certificate{Subject: marked}, true},
		"the simulated ARK":   {&x509.Certificate{Subject: pkix.Name{CommonName: ARKCommonName}}, true},
		"issued by sim's ARK": {&x509.Certificate{Issuer: pkix.Name{CommonName: ARKCommonName}}, true},
	} {
		if got := IsSimulated(c.cert); got != c.want {
			t.Errorf("%s: IsSimulated = %v", name, got)
		}
	}
}
