package reattest

import (
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	sevtest "github.com/google/go-sev-guest/testing"

	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/attest/fakecvm"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

// The genuine Intel collateral and quotes of launcher/attest's tests
// (launcher/attest/testdata/tdx/README.md: sources and licenses).
const (
	tdxTestdata  = "../../attest/testdata/tdx/"
	collB0C06F   = tdxTestdata + "dcap-qvl/collateral-b0c06f"
	coll90C06F   = tdxTestdata + "dcap-qvl/collateral-90c06f"
	upToDateTD   = tdxTestdata + "dcap-qvl/tdx_quote" // UpToDate under collB0C06F
	oldPlatformT = tdxTestdata + "dstack/quote.bin"   // below every TCB level of collB0C06F
)

// collTime is within collB0C06F's validity (2025-06-19 to 2025-07-19).
func collTime() time.Time { return time.Date(2025, time.June, 20, 0, 0, 0, 0, time.UTC) }

// copyDir copies the files of src into dst, replacing what dst held.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	old, _ := os.ReadDir(dst)
	for _, e := range old {
		os.Remove(filepath.Join(dst, e.Name()))
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tdxCheck re-attests the TD whose quote is at path, as the node agent
// does, with the node's collateral directory dir ("" for none), and
// returns the verdict. The quote's REPORT_DATA is not this check's nonce
// binding (a genuine quote was not made for it): a quote that passes the
// collateral is refused on REPORT_DATA, after it.
func tdxCheck(t *testing.T, c *Checker, path string) Verdict {
	t.Helper()
	quote, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	q, err := attest.ParseTDXQuote(quote)
	if err != nil {
		t.Fatal(err)
	}
	body := q.GetTdQuoteBody()
	return c.Check(Input{
		Evidence: &adminapi.EvidenceResponse{Tee: "tdx", Kind: "tdx", Report: quote, Mrconfigid: body.GetMrConfigId(), Vcpus: 1},
		Nonce:    []byte("a fresh nonce of the node agent"),
		Pinned:   body.GetMrTd(), // seen before: its MRTD, no measured boot pinned
		Now:      collTime(),
	})
}

// Re-attestation judges a TD's platform with the node's offline collateral
// (attestation.collateral_dir), as the shim does at start: a platform
// Intel's TCB info rates below every level is refused at the next
// re-attestation, naming the TCB status, as the node's failure; the same
// quote without collateral is judged on the rest only. An up-to-date
// platform passes the collateral (and is refused here only for the
// genuine quote's REPORT_DATA, which is not this check's nonce).
func TestReattestTDXCollateral(t *testing.T) {
	dir := t.TempDir()
	copyDir(t, collB0C06F, dir)
	with := &Checker{Trusts: (&nodeTrusts{stateRoot: t.TempDir(), collateralDir: dir, now: collTime}).trusts}
	without := &Checker{Trusts: (&nodeTrusts{stateRoot: t.TempDir(), now: collTime}).trusts}

	v := tdxCheck(t, with, oldPlatformT)
	if v.Status != StatusFalse || v.Reason != ReasonTCBBelowMinimum || !v.Node || !strings.Contains(v.Message, "TDX TCB status") || !strings.Contains(v.Message, "no matching TCB level") {
		t.Fatalf("an old platform under Intel's collateral: %+v, want False, %s, the node's, naming the TDX TCB status", v, ReasonTCBBelowMinimum)
	}
	t.Logf("refused: %s: %s", v.Reason, v.Message)
	if v := tdxCheck(t, without, oldPlatformT); strings.Contains(v.Message, "TCB status") || v.Node {
		t.Fatalf("without collateral the platform is not judged, yet: %+v", v)
	}
	v = tdxCheck(t, with, upToDateTD)
	if v.Reason != ReasonEvidenceRejected || v.Node || !strings.Contains(v.Message, "REPORT_DATA") || strings.Contains(v.Message, "TCB status") {
		t.Fatalf("an up-to-date platform: %+v, want it past the collateral, refused on REPORT_DATA", v)
	}

	// The operator refreshes the directory: the next check reads it.
	// Collateral for another FMSPC only: the up-to-date platform's TCB
	// info is gone, so it cannot be judged.
	copyDir(t, coll90C06F, dir)
	v = tdxCheck(t, with, upToDateTD)
	if v.Status == StatusTrue || !strings.Contains(v.Message, "b0c06f") {
		t.Fatalf("after the collateral changed: %+v, want the platform's FMSPC b0c06f named", v)
	}
	t.Logf("after the refresh: %s: %s", v.Reason, v.Message)
	copyDir(t, collB0C06F, dir)
	if v := tdxCheck(t, with, upToDateTD); v.Reason != ReasonEvidenceRejected || !strings.Contains(v.Message, "REPORT_DATA") {
		t.Fatalf("the collateral restored: %+v", v)
	}
}

// The collateral directory is loaded as the shim loads it: AMD's CRLs
// into an snp trust, Intel's files into a tdx one; one
// that does not load (no AMD CRL in it) fails the check as the node's
// inability to verify (Unknown), naming the directory's key; unchanged
// files are not loaded again.
func TestNodeTrustsCollateral(t *testing.T) {
	dir := t.TempDir()
	crl := []byte("an AMD CRL, as c8s-launcher collateral fetch writes it")
	if err := os.WriteFile(filepath.Join(dir, attest.AMDCRLFile("Milan", false)), crl, 0o644); err != nil {
		t.Fatal(err)
	}
	trusts := NodeTrusts(t.TempDir(), dir)
	ts, err := trusts("snp")
	if err != nil || len(ts) != 1 || len(ts[0].AMDCRLs) != 1 || string(ts[0].AMDCRLs[0]) != string(crl) {
		t.Fatalf("snp: %+v, %v: want the AMD CRL of the collateral directory", ts, err)
	}

	tdxDir := t.TempDir()
	copyDir(t, collB0C06F, tdxDir)
	tdx := NodeTrusts(t.TempDir(), tdxDir)
	a, err := tdx("tdx")
	if err != nil || a[0].TDXCollateral == nil {
		t.Fatalf("tdx: %+v, %v: want Intel's collateral", a, err)
	}
	if b, err := tdx("tdx"); err != nil || b[0].TDXCollateral != a[0].TDXCollateral {
		t.Fatalf("tdx, files unchanged: %v; want the collateral loaded before", err)
	}

	empty := NodeTrusts(t.TempDir(), t.TempDir())
	if _, err := empty("snp"); err == nil || !strings.Contains(err.Error(), "attestation.collateral_dir") || !strings.Contains(err.Error(), "no AMD CRL") {
		t.Fatalf("a directory without an AMD CRL: err = %v", err)
	}
	c := &Checker{Trusts: empty}
	v := c.Check(Input{Evidence: &adminapi.EvidenceResponse{Tee: "snp", Kind: "snp", Vcpus: 1, Report: make([]byte, 1184)}, Pinned: bytesOf(1, 48), Nonce: []byte("n"), Now: time.Now()})
	if v.Status != StatusUnknown || v.Reason != ReasonVerifierError || !strings.Contains(v.Message, "collateral_dir") {
		t.Fatalf("a collateral directory that does not load: %+v, want Unknown, %s", v, ReasonVerifierError)
	}
}

// SYNTHETIC (no genuine AMD CRL that revokes anything is public; the
// chain is go-sev-guest's test-only AMD signer): a chip whose VCEK a CRL
// in the node's collateral directory revokes is refused at the next
// re-attestation, naming the certificate, as the node's failure; the
// same evidence passes with a CRL that revokes nothing, and without
// collateral.
func TestReattestSNPCRL(t *testing.T) {
	chip := make([]byte, abi.ChipIDSize)
	copy(chip, "a synthetic chip")
	now := time.Now().Add(-time.Hour)
	s, err := (&sevtest.AmdSignerBuilder{
		Keys: sevtest.DefaultAmdKeys(), ProductName: "Milan-B1", CSPID: "c8s-test",
		ArkCreationTime: now, AskCreationTime: now, AsvkCreationTime: now, VcekCreationTime: now,
		AskCustom:  sevtest.CertOverride{KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign},
		VcekCustom: sevtest.CertOverride{Extensions: sevtest.CustomExtensions(fakecvm.TCB, chip, "c8s-test", "Milan-B1")},
	}).TestOnlyCertChain()
	if err != nil {
		t.Fatal(err)
	}
	nonce := []byte("a fresh nonce of the node agent")
	rd := reportdata.Host(nonce)
	tcb := fakecvm.TCBValue(t, fakecvm.TCB)
	raw, err := abi.ReportToAbiBytes(&spb.Report{
		Version: 2, Policy: fakecvm.Policy, SignatureAlgo: abi.SignEcdsaP384Sha384, ReportData: rd[:], Measurement: fakecvm.Digest,
		FamilyId: make([]byte, 16), ImageId: make([]byte, 16), HostData: make([]byte, 32), IdKeyDigest: make([]byte, 48),
		AuthorKeyDigest: make([]byte, 48), ReportId: make([]byte, 32), ReportIdMa: make([]byte, 32), ChipId: chip,
		CurrentTcb: tcb, ReportedTcb: tcb, CommittedTcb: tcb, LaunchTcb: tcb, PlatformInfo: 1, Signature: make([]byte, abi.SignatureSize),
	})
	if err != nil {
		t.Fatal(err)
	}
	r, sig, err := s.Sign(abi.SignedComponent(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := abi.SetSignature(r, sig, raw); err != nil {
		t.Fatal(err)
	}
	table := abi.CertsFromProto(&spb.CertificateChain{VcekCert: s.Vcek.Raw}).Marshal()
	crl := func(revoked ...*big.Int) []byte {
		tmpl := &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: now, NextUpdate: time.Now().Add(24 * time.Hour)}
		for _, n := range revoked {
			tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: n, RevocationTime: now})
		}
		ask := *s.Ask
		if len(ask.SubjectKeyId) == 0 {
			ask.SubjectKeyId = []byte("synthetic") // the test-only ASK has none
		}
		der, err := x509.CreateRevocationList(rand.Reader, tmpl, &ask, s.Keys.Ask)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	check := func(dir string) Verdict {
		n := &nodeTrusts{stateRoot: t.TempDir(), collateralDir: dir, roots: func(string) (attest.Trust, error) {
			return attest.Trust{Mode: attest.ModeSNP, SNPRoots: fakecvm.RootsPEM(s)}, nil
		}}
		return (&Checker{Trusts: n.trusts}).Check(Input{
			Evidence: &adminapi.EvidenceResponse{Tee: "snp", Kind: "snp", Report: raw, CertTable: table, HostData: make([]byte, 32), Vcpus: 1},
			Nonce:    nonce, Pinned: fakecvm.Digest, Now: time.Now(),
		})
	}
	dir := t.TempDir()
	writeCRL := func(der []byte) {
		if err := os.WriteFile(filepath.Join(dir, attest.AMDCRLFile("Milan", false)), der, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCRL(crl())
	if v := check(dir); v.Status != StatusTrue {
		t.Fatalf("a CRL that revokes nothing: %+v", v)
	}
	if v := check(""); v.Status != StatusTrue {
		t.Fatalf("no collateral: %+v", v)
	}
	writeCRL(crl(s.Vcek.SerialNumber))
	v := check(dir)
	if v.Status != StatusFalse || v.Reason != ReasonChipRevoked || !v.Node || !strings.Contains(v.Message, "VCEK") || !strings.Contains(v.Message, "revoked") {
		t.Fatalf("a revoked VCEK: %+v, want False, %s, the node's, naming the VCEK", v, ReasonChipRevoked)
	}
	t.Logf("refused: %s: %s", v.Reason, v.Message)
}
