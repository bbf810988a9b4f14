package snpext

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
)

func readCert(t *testing.T, sample, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "snp", sample, file))
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// On the structure version 0 certificates go-sev-guest v0.15.0 reads
// (genuine Milan, Genoa and Siena VCEKs, genuine Milan VLEKs), ParseExtensions
// reads the same product name, HWID, CSP_ID and TCB.
func TestExtensionsAgreeWithUpstream(t *testing.T) {
	for _, tc := range []struct {
		sample, file, line string
		key                Key
	}{
		{"milan-v2-gsg", "vcek.der", Milan, VCEK},
		{"milan-v3-oak", "vcek.der", Milan, VCEK},
		{"milan-v2-azure", "vcek.der", Milan, VCEK},
		{"genoa-v3-azure", "vcek.der", Genoa, VCEK},
		{"genoa-v5-oak", "vcek.der", Genoa, VCEK},
		{"milan-vlek-aws", "vlek.der", Milan, VLEK},
		{"milan-vlek-v2-aws", "vlek.der", Milan, VLEK},
		{"siena-v5-lunal", "vcek.der", Genoa, VCEK},
	} {
		t.Run(tc.sample, func(t *testing.T) {
			c := readCert(t, tc.sample, tc.file)
			got, err := ParseExtensions(c, tc.key, tc.line)
			if err != nil {
				t.Fatal(err)
			}
			signer := abi.VcekReportSigner
			if tc.key == VLEK {
				signer = abi.VlekReportSigner
			}
			want, err := kds.CertificateExtensions(c, signer)
			if err != nil {
				t.Fatal(err)
			}
			if got.TCB.Raw() != uint64(want.TCBVersion) || got.ProductName != want.ProductName ||
				string(got.HWID) != string(want.HWID) || got.CSPID != want.CspID || got.StructVersion != want.StructVersion {
				t.Fatalf("snpext %+v, go-sev-guest %+v", got, want)
			}
			if line, err := CertProductLine(c); err != nil || line != tc.line {
				t.Errorf("CertProductLine = %q, %v", line, err)
			}
		})
	}
}

// Genuine Turin VCEKs (structure version 1: FMC SPL, an 8-byte HWID, no
// spl_4) read with the TCB their KDS URL names; go-sev-guest v0.15.0
// refuses them. When it stops refusing, drop this package (doc.go).
func TestTurinVCEK(t *testing.T) {
	for _, tc := range []struct {
		sample, hwid string
		tcb          TCB
	}{
		// Oak's: kdsintf.amd.com/vcek/v1/Turin/3b42092f69c656d3?ucodeSPL=71&snpSPL=2&teeSPL=0&blSPL=1&fmcSPL=0
		{"turin-v5-oak", "3b42092f69c656d3", TCB{Line: Turin, FMC: 0, Bootloader: 1, TEE: 0, SNP: 2, Microcode: 71}},
		{"turin-vcek-virtee", "1e550a8ee5cf9f4d", TCB{Line: Turin, Microcode: 9}},
	} {
		t.Run(tc.sample, func(t *testing.T) {
			c := readCert(t, tc.sample, "vcek.der")
			e, err := ParseExtensions(c, VCEK, Turin)
			if err != nil {
				t.Fatal(err)
			}
			if e.StructVersion != 1 || e.ProductName != "Turin" || hex.EncodeToString(e.HWID) != tc.hwid || e.TCB != tc.tcb {
				t.Fatalf("extensions %+v", e)
			}
			if _, err := kds.VcekCertificateExtensions(c); err == nil || !strings.Contains(err.Error(), "1.3.6.1.4.1.3704.1.3.9") {
				t.Fatalf("go-sev-guest now reads Turin VCEKs (%v): drop snpext", err)
			}
			// Read as another line, the certificate is refused.
			if _, err := ParseExtensions(c, VCEK, Genoa); err == nil || !strings.Contains(err.Error(), "product name") {
				t.Fatalf("a Turin VCEK for a Genoa report: %v", err)
			}
			if _, err := ParseExtensions(c, VLEK, Turin); err == nil || !strings.Contains(err.Error(), "HWID") {
				t.Fatalf("a Turin VCEK as a VLEK: %v", err)
			}
		})
	}
}

// Turin's TCB_VERSION is FMC, bootloader, TEE, SNP, 3 reserved bytes,
// microcode; Milan's and Genoa's bootloader, TEE, 4 reserved, SNP,
// microcode.
func TestTCBLayouts(t *testing.T) {
	// The genuine Turin report's REPORTED_TCB (little-endian as in the report).
	const turinRaw = 0x4700000002000100
	got := DecomposeTCB(turinRaw, Turin)
	if want := (TCB{Line: Turin, FMC: 0, Bootloader: 1, TEE: 0, SNP: 2, Microcode: 71}); got != want {
		t.Fatalf("Turin %#x = %+v, want %+v", uint64(turinRaw), got, want)
	}
	if got.Raw() != turinRaw || got.String() != "fmc=0 bl=1 tee=0 snp=2 ucode=71" {
		t.Fatalf("Raw %#x, String %q", got.Raw(), got.String())
	}
	// Read in Milan's layout the same bytes mean something else: the
	// layout matters.
	if m := DecomposeTCB(turinRaw, Milan); m.SNP != 0 || m.TEE != 1 {
		t.Fatalf("Milan layout of the Turin TCB: %+v", m)
	}
	const milanRaw = 0xdb18000000000004 // genuine Milan: bl=4 tee=0 snp=24 ucode=219
	m := DecomposeTCB(milanRaw, Milan)
	if m != (TCB{Line: Milan, Bootloader: 4, SNP: 24, Microcode: 219}) || m.Raw() != milanRaw {
		t.Fatalf("Milan %+v", m)
	}
	if kp := kds.DecomposeTCBVersion(milanRaw); kp.BlSpl != m.Bootloader || kp.SnpSpl != m.SNP || kp.UcodeSpl != m.Microcode || kp.TeeSpl != m.TEE {
		t.Fatalf("go-sev-guest reads %+v", kp)
	}
	if ReservedBits(turinRaw, Turin) != 0 || ReservedBits(milanRaw, Milan) != 0 || ReservedBits(turinRaw|1<<40, Turin) == 0 || ReservedBits(milanRaw|1<<24, Milan) == 0 {
		t.Fatal("reserved bits")
	}
	min := TCB{Line: Turin, FMC: 1, SNP: 3}
	if got.AtLeast(min) || got.Below(min) != "fmc 0 < 1, snp 2 < 3" {
		t.Fatalf("AtLeast/Below: %q", got.Below(min))
	}
}

// Siena and Bergamo (family 19h, model A0h) are Genoa-line; go-sev-guest
// v0.15.0 calls them Unknown.
func TestProductLines(t *testing.T) {
	for _, tc := range []struct {
		cpuid CPUID
		line  string
	}{
		{CPUID{0x19, 0x01, 1}, Milan},
		{CPUID{0x19, 0x11, 1}, Genoa},
		{CPUID{0x19, 0xA0, 2}, Genoa}, // Siena, Bergamo
		{CPUID{0x1A, 0x02, 1}, Turin},
		{CPUID{0x1A, 0x11, 0}, Turin}, // Turin dense
	} {
		if got, err := ProductLine(tc.cpuid); err != nil || got != tc.line {
			t.Errorf("%v: %q, %v; want %s", tc.cpuid, got, err, tc.line)
		}
	}
	if _, err := ProductLine(CPUID{0x17, 0x31, 0}); err == nil {
		t.Error("a Rome CPUID (no SEV-SNP) has a product line")
	}
	// Siena's CPUID_1_EAX: go-sev-guest does not know it. Drop the Siena
	// mapping here when it does.
	if p := kds.ProductLineFromFms(0x00aa0f02); p != "Unknown" {
		t.Fatalf("go-sev-guest maps Siena to %q now", p)
	}
}

// Certificates with AMD extensions c8s does not know, or reserved levels
// that are not zero, are refused (fails closed).
func TestExtensionsFailClosed(t *testing.T) {
	c := readCert(t, "milan-v3-oak", "vcek.der")
	for i, e := range c.Extensions {
		if id, ok := amdExtOf(e.Id); ok && id == extSpl5 {
			bad := *c
			bad.Extensions = append([]pkix.Extension(nil), c.Extensions...)
			bad.Extensions[i].Value = []byte{2, 1, 1}
			if _, err := ParseExtensions(&bad, VCEK, Milan); err == nil || !strings.Contains(err.Error(), "reserved security patch level") {
				t.Fatalf("spl_5=1: %v", err)
			}
			bad.Extensions[i].Id = append(append([]int(nil), amdOID...), 3, 10)
			if _, err := ParseExtensions(&bad, VCEK, Milan); err == nil || !strings.Contains(err.Error(), "not one of AMD's") {
				t.Fatalf("unknown AMD OID: %v", err)
			}
		}
	}
	if _, err := ParseExtensions(c, VCEK, Turin); err == nil {
		t.Fatal("a Milan VCEK read for a Turin report")
	}
	if _, err := ParseExtensions(c, VCEK, Genoa); err == nil || !strings.Contains(err.Error(), "product name") {
		t.Fatalf("a Milan VCEK for a Genoa report: %v", err)
	}
}
