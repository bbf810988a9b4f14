package attest

// SYNTHETIC: VLEK-signed Genoa and Turin reports. No genuine one is public
// (testdata/snp/README.md lists where we looked: every genuine VLEK sample
// is Milan, from AWS), so these chains are go-sev-guest's test-only AMD
// signer (sevtest) with an ASVK, never AMD's.

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	sevtest "github.com/google/go-sev-guest/testing"

	"github.com/c8s-dev/c8s/launcher/attest/fakecvm"
	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

// synthVLEKCase is a product line's VLEK-signed report: its CPUID, the TCB
// its VLEK is certified for, and that VLEK's AMD extensions.
type synthVLEKCase struct {
	line  string
	cpuid snpext.CPUID
	tcb   snpext.TCB
}

var synthVLEKCases = []synthVLEKCase{
	{snpext.Genoa, snpext.CPUID{Family: 0x19, Model: 0x11, Stepping: 1},
		snpext.TCB{Line: snpext.Genoa, Bootloader: 10, SNP: 23, Microcode: 84}},
	{snpext.Turin, snpext.CPUID{Family: 0x1A, Model: 0x02, Stepping: 1},
		snpext.TCB{Line: snpext.Turin, FMC: 1, Bootloader: 3, TEE: 2, SNP: 5, Microcode: 97}},
}

const synthCSPID = "c8s-test-csp"

// vlekExtensions are the AMD extensions of a VLEK for c in c.line's
// layout: structure version 0 with spl_4 to spl_7 (Milan, Genoa), or 1
// with the FMC level and without spl_4 (Turin), and a CSP_ID, no HWID.
func (c synthVLEKCase) vlekExtensions(t *testing.T) []pkix.Extension {
	t.Helper()
	integer := func(v int) []byte {
		b, err := asn1.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ia5 := func(s string) []byte {
		b, err := asn1.MarshalWithParams(s, "ia5")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	oid := func(minor int) asn1.ObjectIdentifier {
		return asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 3704, 1, 3, minor}
	}
	exts := []pkix.Extension{
		{Id: kds.OidStructVersion, Value: integer(int(snpext.StructVersion(c.line)))},
		{Id: kds.OidProductName1, Value: ia5(c.line)},
		{Id: kds.OidBlSpl, Value: integer(int(c.tcb.Bootloader))},
		{Id: kds.OidTeeSpl, Value: integer(int(c.tcb.TEE))},
		{Id: kds.OidSnpSpl, Value: integer(int(c.tcb.SNP))},
		{Id: kds.OidUcodeSpl, Value: integer(int(c.tcb.Microcode))},
		{Id: kds.OidCspID, Value: ia5(synthCSPID)},
	}
	first := 4
	if snpext.HasFMC(c.line) {
		exts = append(exts, pkix.Extension{Id: oid(9), Value: integer(int(c.tcb.FMC))})
		first = 5 // structure version 1 has no spl_4
	}
	for minor := first; minor <= 7; minor++ {
		exts = append(exts, pkix.Extension{Id: oid(minor), Value: integer(0)})
	}
	return exts
}

// signer is a test-only AMD chain of c.line with an ASVK and a VLEK, with
// go-sev-guest's fixed test keys.
func (c synthVLEKCase) signer(t *testing.T) *sevtest.AmdSigner {
	t.Helper()
	return c.signerWith(t, sevtest.DefaultAmdKeys())
}

// otherSigner is a chain of c.line whose ARK and ASVK keys are not
// signer's (go-sev-guest's fixed ASK and ARK test keys, swapped).
func (c synthVLEKCase) otherSigner(t *testing.T) *sevtest.AmdSigner {
	t.Helper()
	keys := sevtest.DefaultAmdKeys()
	keys.Ark, keys.Asvk = sevtest.DefaultAsk(), sevtest.DefaultArk()
	return c.signerWith(t, keys)
}

func (c synthVLEKCase) signerWith(t *testing.T, keys *sevtest.AmdKeys) *sevtest.AmdSigner {
	t.Helper()
	now := time.Now().Add(-time.Hour)
	b := &sevtest.AmdSignerBuilder{
		Keys: keys, ProductName: c.line, CSPID: synthCSPID,
		ArkCreationTime: now, AskCreationTime: now, AsvkCreationTime: now, VcekCreationTime: now, VlekCreationTime: now,
		VlekCustom: sevtest.CertOverride{Extensions: c.vlekExtensions(t)},
	}
	s, err := b.TestOnlyCertChain()
	if err != nil {
		t.Fatal(err)
	}
	if s.Asvk.Subject.CommonName != "SEV-VLEK-"+c.line || s.Vlek.Issuer.CommonName != "SEV-VLEK-"+c.line {
		t.Fatalf("test signer: ASVK %q, VLEK issued by %q", s.Asvk.Subject.CommonName, s.Vlek.Issuer.CommonName)
	}
	return s
}

// report is a version 3 report of c's processor at c.tcb, signed by s's
// VLEK (SIGNING_KEY 1) from VMPL 1 with a zero CHIP_ID, as AWS's are.
func (c synthVLEKCase) report(t *testing.T, s *sevtest.AmdSigner, nonce []byte) ([]byte, *Policy) {
	t.Helper()
	tcb := c.tcb.Raw()
	var rd [64]byte
	copy(rd[:], nonce)
	raw, err := abi.ReportToAbiBytes(&spb.Report{
		Version: 3, Policy: 0x30000, SignatureAlgo: abi.SignEcdsaP384Sha384, ReportData: rd[:], Measurement: fakecvm.Digest,
		FamilyId: make([]byte, 16), ImageId: make([]byte, 16), HostData: make([]byte, 32), IdKeyDigest: make([]byte, 48),
		AuthorKeyDigest: make([]byte, 48), ReportId: make([]byte, 32), ReportIdMa: make([]byte, 32), ChipId: make([]byte, 64),
		CurrentTcb: tcb, ReportedTcb: tcb, CommittedTcb: tcb, LaunchTcb: tcb, PlatformInfo: 1, Vmpl: 1,
		SignerInfo: abi.ComposeSignerInfo(abi.SignerInfo{SigningKey: abi.VlekReportSigner}),
		Signature:  make([]byte, abi.SignatureSize),
	})
	if err != nil {
		t.Fatal(err)
	}
	raw[0x188], raw[0x189], raw[0x18A] = c.cpuid.Family, c.cpuid.Model, c.cpuid.Stepping
	resign(t, s, raw)
	vmpl := 1
	return raw, &Policy{Measurements: map[int]Hex{1: fakecvm.Digest}, Nonce: nonce, MinTCB: tcb, VMPL: &vmpl}
}

// vlekRoots is the ASVK and ARK of s, as AMD's KDS serves them
// (vlek/v1/<line>/cert_chain).
func vlekRoots(s *sevtest.AmdSigner) []byte {
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Asvk.Raw})
	return append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Ark.Raw})...)
}

func rootsVerifier(t *testing.T, roots []byte) *Verifier {
	t.Helper()
	v, err := NewVerifier(Trust{Mode: ModeSNP, SNPRoots: roots})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// SYNTHETIC: a VLEK-signed Genoa and Turin report verifies against its
// line's ASVK and ARK, in its line's TCB layout; one flipped bit, the
// VLEK under the VCEK's GUID, the ASK instead of the ASVK, another line's
// VLEK and another CSP's VLEK chain are refused.
func TestSyntheticVLEKGenoaTurin(t *testing.T) {
	for _, c := range synthVLEKCases {
		t.Run(c.line, func(t *testing.T) {
			s := c.signer(t)
			raw, p := c.report(t, s, []byte(c.line+" vlek nonce"))
			table := snpTable(snpext.VLEK, s.Vlek.Raw)
			claims, err := rootsVerifier(t, vlekRoots(s)).VerifySNP(raw, table, p)
			if err != nil {
				t.Fatalf("VLEK-signed %s report: %v", c.line, err)
			}
			if claims.ProductLine != c.line || claims.SigningKey != string(snpext.VLEK) || claims.TCB != c.tcb.String() || claims.VMPL != 1 {
				t.Fatalf("claims %+v", claims)
			}

			// One flipped bit of the signed report (MEASUREMENT).
			bad := append([]byte(nil), raw...)
			bad[0x90] ^= 1
			p2 := *p
			p2.Measurements = map[int]Hex{1: bad[0x90 : 0x90+48]}
			_, err = rootsVerifier(t, vlekRoots(s)).VerifySNP(bad, table, &p2)
			wantErr(t, err, KindSignature, "report signature")

			// The VLEK sent under the VCEK's GUID: no VLEK in the table.
			_, err = rootsVerifier(t, vlekRoots(s)).VerifySNP(raw, snpTable(snpext.VCEK, s.Vlek.Raw), p)
			wantErr(t, err, KindFormat, "certificate table", "no VLEK certificate")

			// The line's ASK and ARK only (VCEK roots): the VLEK cannot chain.
			_, err = rootsVerifier(t, fakecvm.RootsPEM(s)).VerifySNP(raw, table, p)
			wantErr(t, err, KindSignature, "VLEK certificate chain", "ASVK")

			// Another CSP's chain of the same line (another ASVK and ARK).
			other := c.otherSigner(t)
			_, err = rootsVerifier(t, vlekRoots(other)).VerifySNP(raw, table, p)
			wantErr(t, err, KindSignature, "VLEK certificate chain")

			// The other line's VLEK for this report.
			for _, o := range synthVLEKCases {
				if o.line == c.line {
					continue
				}
				os := o.signer(t)
				_, err = rootsVerifier(t, vlekRoots(s)).VerifySNP(raw, snpTable(snpext.VLEK, os.Vlek.Raw), p)
				wantErr(t, err, KindSignature, "VLEK certificate chain", "issued by SEV-VLEK-"+c.line)
			}

			// The report's TCB is read in its line's layout: a minimum one
			// above in the SNP component refuses it.
			above := c.tcb
			above.SNP++
			p3 := *p
			p3.MinTCB = above.Raw()
			_, err = rootsVerifier(t, vlekRoots(s)).VerifySNP(raw, table, &p3)
			wantErr(t, err, KindPolicy, "TCB below minimum", "snp")
		})
	}
}

// The synthetic VLEKs carry what the certificates need to be read in their
// line's layout (guards the fixture, not the verifier).
func TestSyntheticVLEKExtensions(t *testing.T) {
	for _, c := range synthVLEKCases {
		s := c.signer(t)
		cert, err := x509.ParseCertificate(s.Vlek.Raw)
		if err != nil {
			t.Fatal(err)
		}
		e, err := snpext.ParseExtensions(cert, snpext.VLEK, c.line)
		if err != nil {
			t.Fatalf("%s: %v", c.line, err)
		}
		if e.CSPID != synthCSPID || !e.TCB.Equal(c.tcb) || e.StructVersion != snpext.StructVersion(c.line) {
			t.Fatalf("%s: %+v", c.line, e)
		}
	}
}
