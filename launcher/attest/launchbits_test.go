package attest

import (
	"strings"
	"testing"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

// TestSNPLaunchPolicyBitsRefused: the guest policy is the host's choice
// at launch and not measured. A report of a guest that accepts a
// migration agent (which can export its memory) or CXL memory is refused
// on every product line, not only where go-sev-guest's validation runs
// too (Milan, Genoa).
func TestSNPLaunchPolicyBitsRefused(t *testing.T) {
	chip := synthChip()
	for _, c := range []struct {
		name  string
		cpuid snpext.CPUID
		bit   uint // of POLICY
		field string
	}{
		{"MIGRATE_MA, Siena", snpext.CPUID{Family: 0x19, Model: 0xA0, Stepping: 2}, 18, "MIGRATE_MA"},
		{"MIGRATE_MA, Genoa", snpext.CPUID{Family: 0x19, Model: 0x11, Stepping: 1}, 18, "MIGRATE_MA"},
		{"CXL_ALLOW, Siena", snpext.CPUID{Family: 0x19, Model: 0xA0, Stepping: 2}, 21, "CXL_ALLOW"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := synthSigner(t, "Genoa", chip)
			raw, p := synthReport(t, s, c.cpuid, chip, []byte("nonce"))
			if _, err := synthVerifier(t, s).VerifySNP(raw, snpTable(snpext.VCEK, s.Vcek.Raw), p); err != nil {
				t.Fatalf("the report as launched: %v", err)
			}
			raw[0x08+c.bit/8] |= 1 << (c.bit % 8) // POLICY, little-endian at 08h
			resign(t, s, raw)
			_, err := synthVerifier(t, s).VerifySNP(raw, snpTable(snpext.VCEK, s.Vcek.Raw), p)
			if kindOf(err) != KindPolicy || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("POLICY bit %d set: %v, want a policy error naming %s", c.bit, err, c.field)
			}
		})
	}
}

// TestTDXMigratableRefused: a TD launched migratable can have its memory
// exported by a migration TD the host binds: refused.
func TestTDXMigratableRefused(t *testing.T) {
	p := &Policy{MRTD: make(Hex, 48)}
	body := &tdxpb.TDQuoteBody{MrTd: make([]byte, 48), TdAttributes: []byte{0, 0, 0, 0x10, 0, 0, 0, 0}, ReportData: make([]byte, 64)} // SEPT_VE_DISABLE only
	if err := checkTDXFields(body, p, make([]byte, 64)); err != nil {
		t.Fatalf("a TD with SEPT_VE_DISABLE only: %v", err)
	}
	body.TdAttributes[3] |= 0x20 // MIGRATABLE, bit 29
	if err := checkTDXFields(body, p, make([]byte, 64)); kindOf(err) != KindPolicy || !strings.Contains(err.Error(), "MIGRATABLE") {
		t.Fatalf("a migratable TD: %v, want a policy error naming MIGRATABLE", err)
	}
}
