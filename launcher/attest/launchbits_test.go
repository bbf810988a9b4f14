package attest

import (
	"strings"
	"testing"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/testing/testdata"

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

// simPolicyReport is f's report launched with guest policy and
// PLATFORM_INFO platform, signed by f's simulated chip.
func simPolicyReport(t *testing.T, f *fixture, policy, platform uint64) []byte {
	t.Helper()
	f.req.Policy = policy
	r, err := f.sp.ReportProto(f.req)
	if err != nil {
		t.Fatal(err)
	}
	r.PlatformInfo = platform
	raw, err := f.sp.Sign(r)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestSNPRequiredGuestPolicy: an owner who pins a guest policy gets only
// guests launched at least as restrictively (SMT off, RAPL disabled,
// ciphertext hiding, ...), whatever else the host chose, with the bit
// named that is missing.
func TestSNPRequiredGuestPolicy(t *testing.T) {
	const (
		noSMT     = 0x20000
		smt       = 0x30000
		rapl      = 1 << 23
		cthiding  = 1 << 24
		noSwap    = 1 << 25
		single    = 1 << 20
		xts       = 1 << 22
		abi155    = 0x0137 // ABI 1.55
		platSMT   = 1 << 0
		platRAPL  = 1 << 3
		platCTH   = 1 << 4
		platforms = platRAPL | platCTH
	)
	for _, c := range []struct {
		name                       string
		required, policy, platform uint64
		field                      string // "": accepted
		words                      []string
	}{
		{"nothing pinned", 0, smt, platSMT, "", nil},
		{"SMT allowed by the pin", smt, smt, platSMT, "", nil},
		{"no SMT, launched without", noSMT, noSMT, 0, "", nil},
		{"no SMT, launched with SMT", noSMT, smt, 0, "guest policy SMT bit", []string{"sibling hyperthread"}},
		{"no SMT, platform has SMT on", noSMT, noSMT, platSMT, "PLATFORM_INFO SMT_EN bit", nil},
		{"all restrictions met", smt | rapl | cthiding | noSwap | single | xts, smt | rapl | cthiding | noSwap | single | xts, platforms, "", nil},
		{"more restrictive than pinned", smt, noSMT | rapl | noSwap, platforms, "", nil},
		{"RAPL_DIS missing", smt | rapl, smt, platforms, "guest policy", []string{"RAPL_DIS set", "POLICY=0x30000"}},
		{"two missing, both named", smt | cthiding | noSwap, smt | rapl, platforms, "guest policy", []string{"CIPHERTEXT_HIDING, PAGE_SWAP_DISABLE set"}},
		{"SINGLE_SOCKET missing", smt | single, smt | xts, 0, "guest policy", []string{"SINGLE_SOCKET"}},
		{"MEM_AES_256_XTS missing", smt | xts, smt | single, 0, "guest policy", []string{"MEM_AES_256_XTS"}},
		{"ciphertext hiding asked, not in force", smt | cthiding, smt | cthiding, platRAPL, "PLATFORM_INFO CIPHERTEXT_HIDING", nil},
		{"RAPL_DIS asked, not in force", smt | rapl, smt | rapl, platCTH, "PLATFORM_INFO RAPL_DIS", nil},
		{"ABI version met", smt | abi155, smt | 0x0138, 0, "", nil},
		{"ABI version below", smt | abi155, smt | 0x0136, 0, "guest policy ABI version", []string{"at least 1.55", "1.54"}},
		{"ABI major below", smt | 0x0200, smt | 0x01ff, 0, "guest policy ABI version", []string{"at least 2.0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			f.policy.SNPGuestPolicy = c.required
			_, err := simVerifier(t, f.sp).VerifySNP(simPolicyReport(t, f, c.policy, c.platform), f.sp.CertTable(), &f.policy)
			if c.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantErr(t, err, KindPolicy, c.field, c.words...)
		})
	}
}

// TestSNPRequiredGuestPolicyValue: a pinned guest policy that cannot be
// one, or that would read as allowing what c8s refuses, is a
// configuration error naming the bit.
func TestSNPRequiredGuestPolicyValue(t *testing.T) {
	for v, want := range map[uint64]string{
		0x10000:         "lacks bit 17",
		0x30000 | 1<<19: "DEBUG",
		0x30000 | 1<<18: "MIGRATE_MA",
		0x30000 | 1<<21: "CXL_ALLOW",
		0x30000 | 1<<26: "reserved bits 0x4000000",
		0x30000 | 1<<40: "reserved bits",
	} {
		f := newFixture(t)
		f.policy.SNPGuestPolicy = v
		_, err := simVerifier(t, f.sp).VerifySNP(f.report(t), f.sp.CertTable(), &f.policy)
		wantErr(t, err, KindConfig, "policy", want)
	}
}

// TestGenuineSNPRequiredGuestPolicy: genuine reports from the field
// against pinned guest policies. Each was launched with SMT allowed, none
// with RAPL_DIS or ciphertext hiding; Azure's name ABI 0.31.
func TestGenuineSNPRequiredGuestPolicy(t *testing.T) {
	for _, s := range genuineSNP {
		t.Run(s.dir, func(t *testing.T) {
			smp := readSample(t, s.dir, s.key)
			p := smp.policyFrom()
			p.AllowProvisionalFirmware = s.provisional
			p.SNPGuestPolicy = smp.proto.GetPolicy() &^ snpPolicyDebug
			if _, err := amdVerifier(t, smp.at).VerifySNP(smp.report, smp.table, p); err != nil {
				t.Fatalf("pinned to its own policy %#x: %v", p.SNPGuestPolicy, err)
			}
			p.SNPGuestPolicy = 0x20000
			_, err := amdVerifier(t, smp.at).VerifySNP(smp.report, smp.table, p)
			wantErr(t, err, KindPolicy, "guest policy SMT bit")
			p.SNPGuestPolicy = 0x30000 | snpPolicyRAPLDis | snpPolicyCiphertextHiding
			_, err = amdVerifier(t, smp.at).VerifySNP(smp.report, smp.table, p)
			wantErr(t, err, KindPolicy, "guest policy", "RAPL_DIS, CIPHERTEXT_HIDING set")
			p.SNPGuestPolicy = 0x30000 | 0x0137 // ABI 1.55
			_, err = amdVerifier(t, smp.at).VerifySNP(smp.report, smp.table, p)
			wantErr(t, err, KindPolicy, "guest policy ABI version", "at least 1.55")
		})
	}
}

// TestTDXPinnedAttributes: a genuine quote (go-tdx-guest's sample) is
// accepted pinned to its own TD_ATTRIBUTES and XFAM and refused pinned to
// others, naming the bits that differ.
func TestTDXPinnedAttributes(t *testing.T) {
	q, err := ParseTDXQuote(testdata.RawQuote)
	if err != nil {
		t.Fatal(err)
	}
	body := q.GetTdQuoteBody()
	attrs, xfam := Hex(body.GetTdAttributes()), Hex(body.GetXfam())
	p := samplePolicy(t)
	p.TDAttributes, p.XFAM = attrs, xfam
	c, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote, p)
	if err != nil {
		t.Fatalf("pinned to its own attributes %s and XFAM %s: %v", attrs, xfam, err)
	}
	if c.XFAM.String() != xfam.String() || c.TDAttributes.String() != attrs.String() {
		t.Fatalf("claims XFAM %s, TD_ATTRIBUTES %s", c.XFAM, c.TDAttributes)
	}
	t.Logf("sample quote: TD_ATTRIBUTES %s, XFAM %s", attrs, xfam)

	other := append(Hex(nil), attrs...)
	other[3] ^= 0x10 // SEPT_VE_DISABLE
	other[7] ^= 0x80 // PERFMON
	p.TDAttributes = other
	_, err = tdxVerifier(t).VerifyTDX(testdata.RawQuote, p)
	wantErr(t, err, KindMismatch, "TD_ATTRIBUTES", "SEPT_VE_DISABLE", "PERFMON")

	p.TDAttributes = attrs
	otherXFAM := append(Hex(nil), xfam...)
	otherXFAM[0] ^= 0x04 // AVX
	p.XFAM = otherXFAM
	_, err = tdxVerifier(t).VerifyTDX(testdata.RawQuote, p)
	wantErr(t, err, KindMismatch, "XFAM", otherXFAM.String(), xfam.String())

	p.XFAM = xfam[:4]
	_, err = tdxVerifier(t).VerifyTDX(testdata.RawQuote, p)
	wantErr(t, err, KindConfig, "policy", "xfam is 4 bytes, expected 8")
}
