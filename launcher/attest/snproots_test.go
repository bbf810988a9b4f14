package attest

import (
	"strings"
	"testing"

	sevtest "github.com/google/go-sev-guest/testing"

	"github.com/c8s-dev/c8s/launcher/attest/fakecvm"
)

// Trust.SNPRoots replaces AMD's roots in ModeSNP only, and only with an
// ASK and ARK of a product line.
func TestSNPRoots(t *testing.T) {
	roots := fakecvm.RootsPEM(fakecvm.Signer(t, sevtest.DefaultAmdKeys()))
	v, err := NewVerifier(Trust{Mode: ModeSNP, SNPRoots: roots})
	if err != nil {
		t.Fatal(err)
	}
	if len(v.snpRoots["Milan"]) != 1 || v.snpRoots["Milan"][0].ProductCerts.Ark.Subject.CommonName != "ARK-Milan" {
		t.Fatalf("roots = %v", v.snpRoots)
	}
	for _, m := range []Mode{ModeTDX, ModeSim} {
		if _, err := NewVerifier(Trust{Mode: m, SNPRoots: roots, SimCertChain: []byte("x")}); err == nil || !strings.Contains(err.Error(), "mode "+string(m)+" takes no SNP roots") {
			t.Fatalf("%s with SNP roots: %v", m, err)
		}
	}
	if _, err := NewVerifier(Trust{Mode: ModeSNP, SNPRoots: []byte("not PEM")}); err == nil || !strings.Contains(err.Error(), "not an ASK and ARK") {
		t.Fatalf("garbage roots: %v", err)
	}
}
