package snpext

import (
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/c8s-dev/c8s/guest/api/kbs"
)

// CPUID is the processor identification a version 3 or later report
// carries (CPUID_FAM_ID, CPUID_MOD_ID, CPUID_STEP at 0x188-0x18A).
type CPUID struct {
	Family, Model, Stepping uint8
}

func (c CPUID) String() string {
	return fmt.Sprintf("family %#x model %#x stepping %d", c.Family, c.Model, c.Stepping)
}

// ReportCPUID returns the CPUID fields of a raw ATTESTATION_REPORT, and
// false for a version 2 report, which has none.
func ReportCPUID(report []byte) (CPUID, bool) {
	if len(report) < 0x18B || binary.LittleEndian.Uint32(report) < 3 {
		return CPUID{}, false
	}
	return CPUID{Family: report[0x188], Model: report[0x189], Stepping: report[0x18A]}, true
}

// ProductLine is the AMD product line of the processor c identifies.
func ProductLine(c CPUID) (string, error) {
	line, err := kbs.SNPProductLine(c.Family, c.Model)
	if err != nil {
		return "", fmt.Errorf("CPUID %s is not a processor with SEV-SNP that this verifier knows (Milan, Genoa incl. Siena and Bergamo, Turin)", c)
	}
	return line, nil
}

// ProductLineOfName is the product line of a V[CL]EK certificate's
// product name extension ("Milan-B0", "Genoa", "Turin", a VLEK's bare
// "Milan"): its part before the stepping.
func ProductLineOfName(name string) (string, error) {
	line, _, _ := strings.Cut(name, "-")
	switch line {
	case Milan, Genoa, Turin:
		return line, nil
	}
	return "", fmt.Errorf("product name %q is not Milan, Genoa or Turin", name)
}

// CertProductLine is the product line a V[CL]EK certificate's product
// name extension names, for a version 2 report, which carries no CPUID.
func CertProductLine(c *x509.Certificate) (string, error) {
	for _, e := range c.Extensions {
		if id, ok := amdExtOf(e.Id); ok && id == extProductName {
			name, err := ia5(e.Value)
			if err != nil {
				return "", fmt.Errorf("product name extension: %w", err)
			}
			return ProductLineOfName(name)
		}
	}
	return "", errors.New("no product name extension")
}
