package attest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Genuine Intel collateral for FMSPC b0c06f000000 (dcap-qvl's sample/,
// testdata/tdx/README.md), valid 2025-06-19 to 2025-07-19.
const (
	collB0C06F   = "testdata/tdx/dcap-qvl/collateral-b0c06f"
	coll90C06F   = "testdata/tdx/dcap-qvl/collateral-90c06f"
	dcapQuote    = "testdata/tdx/dcap-qvl/tdx_quote"
	dcapOutdated = "testdata/tdx/dcap-qvl/tdx_quote_outdated"
)

var collTime = func() time.Time { return time.Date(2025, time.June, 20, 0, 0, 0, 0, time.UTC) }

func loadColl(t testing.TB, dir string) *TDXCollateral {
	t.Helper()
	c, err := LoadTDXCollateral(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func quotePolicy(t testing.TB, path string) ([]byte, *Policy) {
	t.Helper()
	quote, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParseTDXQuote(quote)
	if err != nil {
		t.Fatal(err)
	}
	body := q.GetTdQuoteBody()
	return quote, &Policy{MRTD: body.GetMrTd(), Nonce: body.GetReportData()}
}

// An up-to-date platform with its genuine collateral passes, offline.
func TestTDXCollateralUpToDate(t *testing.T) {
	quote, p := quotePolicy(t, dcapQuote)
	c, err := tdxVerifierAt(t, collTime, loadColl(t, collB0C06F)).VerifyTDX(quote, p)
	if err != nil {
		t.Fatalf("genuine quote and collateral: %v", err)
	}
	if c.TCB == nil || c.TCB.Status != TCBUpToDate || c.TCB.QEStatus != TCBUpToDate || c.TCB.ModuleStatus != TCBUpToDate || c.TCB.FMSPC != "b0c06f000000" {
		t.Errorf("TCB verdict %+v", c.TCB)
	}
	t.Logf("verdict %+v", c.TCB)
}

// A genuine platform whose TCB is below every level of Intel's TCB info
// for its FMSPC is refused by name: dstack's quote (CPUSVN component 8 is
// 3; every level wants 5).
func TestTDXCollateralRefusesOldPlatform(t *testing.T) {
	quote, p := dstackQuote(t)
	_, err := tdxVerifierAt(t, collTime, loadColl(t, collB0C06F)).VerifyTDX(quote, p)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindPolicy || e.Field != "TDX TCB status" || e.Actual != "no matching TCB level" {
		t.Fatalf("an old platform: %v", err)
	}
	t.Log(err)
}

// dcap-qvl's tdx_quote_outdated (a v5 quote, which go-tdx-guest v0.3.1
// cannot parse, so its fields are read here and only the collateral
// verdict is tested) has, like dstack's, a platform below every level of
// its genuine TCB info (dcap-qvl's own test must add a level to accept
// it): refused by name.
func TestTDXCollateralOutdatedV5(t *testing.T) {
	pl := platformOfV5(t, dcapOutdated)
	coll := loadColl(t, coll90C06F)
	root, err := intelRootCert()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, time.March, 1, 0, 0, 0, 0, time.UTC)
	// The PCK chain is Intel's.
	if _, err := pl.PCK.Verify(x509.VerifyOptions{Roots: mustPool(t), Intermediates: poolOf(pl.PCKCA), CurrentTime: at}); err != nil {
		t.Fatalf("the v5 quote's PCK chain: %v", err)
	}
	_, err = coll.check(root, pl, at, []string{"OutOfDate"})
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindPolicy || e.Actual != "no matching TCB level" {
		t.Fatalf("an out-of-date platform: %v", err)
	}
	t.Log(err)
}

// The named statuses: Intel's genuine TCB info for b0c06f000000 rates a
// platform at PCESVN 5-10 OutOfDate (its second level). SYNTHETIC
// platform TCB (no such genuine quote is public): the genuine dcap-qvl
// quote's CPUSVN and TEE_TCB_SVN with PCESVN 7.
func TestTDXCollateralOutOfDateStatus(t *testing.T) {
	coll := loadColl(t, collB0C06F)
	root, err := intelRootCert()
	if err != nil {
		t.Fatal(err)
	}
	info, err := coll.tcbInfoFor(root, "b0c06f000000", collTime())
	if err != nil {
		t.Fatal(err)
	}
	cpusvn := []byte{3, 3, 2, 2, 4, 1, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0}
	tee := []byte{6, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	res, err := platformStatus(info, cpusvn, 11, tee)
	if err != nil || res.Status != TCBUpToDate {
		t.Fatalf("PCESVN 11: %+v, %v", res, err)
	}
	res, err = platformStatus(info, cpusvn, 7, tee)
	if err != nil || res.Status != "OutOfDate" {
		t.Fatalf("PCESVN 7: %+v, %v", res, err)
	}
	err = judgeStatus("TDX TCB status", res.Status, nil, res)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindPolicy || e.Actual != "OutOfDate" || !strings.Contains(err.Error(), "allow_tcb_status") {
		t.Errorf("OutOfDate, not allowed: %v", err)
	}
	t.Log(err)
	if err := judgeStatus("TDX TCB status", res.Status, []string{"OutOfDate"}, res); err != nil {
		t.Errorf("OutOfDate allowed: %v", err)
	}
	if err := judgeStatus("TDX TCB status", TCBRevoked, []string{"OutOfDate"}, res); kindOf(err) != KindRevoked {
		t.Errorf("Revoked: %v", err)
	}
	// A TDX module older than the TCB info's levels (TDX_01 SVN 1).
	if _, err := platformStatus(info, cpusvn, 11, []byte{1, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}); err == nil || !strings.Contains(err.Error(), "TDX module") {
		t.Errorf("old module: %v", err)
	}
	res, _ = platformStatus(info, cpusvn, 11, []byte{3, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	if res == nil || res.ModuleStatus != "OutOfDate" {
		t.Errorf("TDX_01 SVN 3: %+v", res)
	}
	// Revoked is never a policy's to allow.
	if err := (&Policy{MRTD: make(Hex, 48), AllowTCBStatus: []string{"Revoked"}}).checkTDX(); kindOf(err) != KindConfig {
		t.Errorf("allow Revoked: %v", err)
	}
}

// Altered or stale collateral, or collateral of another platform, is
// refused.
func TestTDXCollateralRefusesBadFiles(t *testing.T) {
	quote, p := quotePolicy(t, dcapQuote)
	// The signed body altered (a TCB level's status upgraded).
	dir := copyDir(t, collB0C06F)
	info := filepath.Join(dir, "tdx_tcb_info_b0c06f000000.json")
	b, _ := os.ReadFile(info)
	os.WriteFile(info, []byte(strings.Replace(string(b), `"tcbStatus":"OutOfDate"`, `"tcbStatus":"UpToDate"`, 1)), 0o644)
	if _, err := tdxVerifierAt(t, collTime, loadColl(t, dir)).VerifyTDX(quote, p); kindOf(err) != KindSignature || !strings.Contains(err.Error(), "TDX TCB info signature") {
		t.Errorf("altered TCB info: %v", err)
	}
	qe := filepath.Join(dir, TDXQEIdentityFile)
	os.WriteFile(info, b, 0o644)
	b, _ = os.ReadFile(qe)
	os.WriteFile(qe, []byte(strings.Replace(string(b), `"isvprodid":2`, `"isvprodid":3`, 1)), 0o644)
	if _, err := tdxVerifierAt(t, collTime, loadColl(t, dir)).VerifyTDX(quote, p); kindOf(err) != KindSignature || !strings.Contains(err.Error(), "QE identity signature") {
		t.Errorf("altered QE identity: %v", err)
	}
	// Stale: a month after the next update.
	late := func() time.Time { return time.Date(2025, time.August, 20, 0, 0, 0, 0, time.UTC) }
	if _, err := tdxVerifierAt(t, late, loadColl(t, collB0C06F)).VerifyTDX(quote, p); kindOf(err) != KindConfig || !strings.Contains(err.Error(), "stale") {
		t.Errorf("stale collateral: %v", err)
	}
	// Another platform's TCB info.
	if _, err := tdxVerifierAt(t, collTime, loadColl(t, coll90C06F)).VerifyTDX(quote, p); kindOf(err) != KindConfig || !strings.Contains(err.Error(), "no TCB info for this platform's FMSPC b0c06f000000") {
		t.Errorf("another FMSPC: %v", err)
	}
	// A missing file.
	os.Remove(filepath.Join(dir, IntelRootCRLFile))
	if _, err := LoadTDXCollateral(dir); err == nil || !strings.Contains(err.Error(), IntelRootCRLFile) {
		t.Errorf("no root CRL: %v", err)
	}
}

// A revoked PCK certificate and a revoked PCK CA are refused by name.
// SYNTHETIC: no genuine revoked TDX platform is public, so a test-only
// root, PCK CA and PCK certificate stand in for Intel's; the revocation
// check runs before anything else the collateral judges.
func TestTDXCollateralRevoked(t *testing.T) {
	root, rootKey := synthCert(t, "Synthetic SGX Root CA", nil, nil, 1)
	ca, caKey := synthCert(t, "Synthetic SGX PCK Platform CA", root, rootKey, 2)
	pck, _ := synthCert(t, "Synthetic SGX PCK Certificate", ca, caKey, 3)
	crl := func(issuer *x509.Certificate, key *ecdsa.PrivateKey, serials ...int64) *x509.RevocationList {
		var entries []x509.RevocationListEntry
		for _, s := range serials {
			entries = append(entries, x509.RevocationListEntry{SerialNumber: big.NewInt(s), RevocationTime: time.Now()})
		}
		der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: time.Now().Add(-time.Hour), NextUpdate: time.Now().Add(time.Hour), RevokedCertificateEntries: entries}, issuer, key)
		if err != nil {
			t.Fatal(err)
		}
		l, _ := x509.ParseRevocationList(der)
		return l
	}
	pl := tdxPlatform{PCK: pck, PCKCA: ca}
	c := &TDXCollateral{rootCRL: crl(root, rootKey), pckCRLs: map[string]*x509.RevocationList{"platform": crl(ca, caKey, 3)}}
	err := c.checkRevocation(root, pl, time.Now())
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindRevoked || e.Field != "PCK certificate" {
		t.Errorf("revoked PCK: %v", err)
	}
	c = &TDXCollateral{rootCRL: crl(root, rootKey, 2), pckCRLs: map[string]*x509.RevocationList{"platform": crl(ca, caKey)}}
	if err := c.checkRevocation(root, pl, time.Now()); !errors.As(err, &e) || e.Kind != KindRevoked || e.Field != "PCK CA certificate" {
		t.Errorf("revoked PCK CA: %v", err)
	}
	c = &TDXCollateral{rootCRL: crl(root, rootKey), pckCRLs: map[string]*x509.RevocationList{"platform": crl(ca, caKey)}}
	if err := c.checkRevocation(root, pl, time.Now()); err != nil {
		t.Errorf("nothing revoked: %v", err)
	}
	// A PCK CRL signed by another key is not believed.
	other, otherKey := synthCert(t, "Synthetic SGX PCK Platform CA", root, rootKey, 4)
	c = &TDXCollateral{rootCRL: crl(root, rootKey), pckCRLs: map[string]*x509.RevocationList{"platform": crl(other, otherKey)}}
	if err := c.checkRevocation(root, pl, time.Now()); kindOf(err) != KindSignature {
		t.Errorf("a PCK CRL from another key: %v", err)
	}
}

// collateral fetch against a server with PCS's API serving the genuine
// files: the fetched collateral verifies the genuine quote.
func TestPCSFetch(t *testing.T) {
	dir := collB0C06F
	read := func(n string) []byte { b, _ := os.ReadFile(filepath.Join(dir, n)); return b }
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.RequestURI())
		switch {
		case r.URL.Path == "/tdx/certification/v4/tcb" && r.URL.Query().Get("fmspc") == "b0c06f000000":
			w.Header().Set("TCB-Info-Issuer-Chain", url.QueryEscape(string(read(TDXTCBInfoChainFile))))
			w.Write(read("tdx_tcb_info_b0c06f000000.json"))
		case r.URL.Path == "/tdx/certification/v4/qe/identity":
			w.Header().Set("SGX-Enclave-Identity-Issuer-Chain", url.QueryEscape(string(read(TDXQEIdentityChainFile))))
			w.Write(read(TDXQEIdentityFile))
		case r.URL.Path == "/sgx/certification/v4/pckcrl" && r.URL.Query().Get("ca") == "platform":
			w.Header().Set("SGX-PCK-CRL-Issuer-Chain", url.QueryEscape(string(read(PCKCRLChainFile))))
			w.Write(read("pck_crl_platform.der"))
		case r.URL.Path == "/IntelSGXRootCA.der":
			w.Write(read(IntelRootCRLFile))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	pcs := &PCSClient{BaseURL: srv.URL, RootCRLURL: srv.URL + "/IntelSGXRootCA.der"}
	files, err := pcs.FetchTDX(context.Background(), "B0C06F000000", []string{"platform"})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if string(b) != string(read(name)) {
			t.Errorf("%s differs from the served file", name)
		}
	}
	if len(files) != 7 {
		t.Errorf("%d files: %v", len(files), paths)
	}
	// verify-report --fetch: the verifier fetches the collateral itself.
	quote, p := quotePolicy(t, dcapQuote)
	v, err := NewVerifier(Trust{Mode: ModeTDX, Now: collTime, FetchCertificates: true, PCS: pcs})
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.VerifyTDX(quote, p)
	if err != nil || c.TCB == nil || c.TCB.Status != TCBUpToDate {
		t.Fatalf("fetched collateral: %+v, %v", c, err)
	}
	// An FMSPC the service does not know.
	if _, err := pcs.FetchTDX(context.Background(), "00906ed50000", nil); kindOf(err) != KindNetwork || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown FMSPC: %v", err)
	}
}

// With no network, fetching fails fast with a network error, not a
// signature error two minutes later.
func TestPCSFetchNoNetwork(t *testing.T) {
	l := httptest.NewServer(http.NotFoundHandler())
	addr := l.URL
	l.Close() // nothing listens there any more
	quote, p := quotePolicy(t, dcapQuote)
	v, err := NewVerifier(Trust{Mode: ModeTDX, Now: collTime, FetchCertificates: true, PCS: &PCSClient{BaseURL: addr, RootCRLURL: addr}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = v.VerifyTDX(quote, p)
	if kindOf(err) != KindNetwork || time.Since(start) > 10*time.Second {
		t.Fatalf("no network: %v after %v, want a network error in seconds", err, time.Since(start))
	}
	t.Logf("%v (after %v)", err, time.Since(start).Round(time.Millisecond))
	// The default client dials with a short timeout.
	tr := (&PCSClient{}).client().Transport.(*http.Transport)
	if tr.TLSHandshakeTimeout != pcsDialTimeout || pcsDialTimeout > 10*time.Second {
		t.Errorf("default transport %+v", tr)
	}
}

// platformOfV5 reads the fields collateral judges from a v5 TDX quote
// (Intel TDX DCAP Quote Generation Library, quote format v5: header, body
// type and size, TD report body, then the v4 signature data).
func platformOfV5(t *testing.T, path string) tdxPlatform {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	if le.Uint16(b) != 5 {
		t.Fatalf("%s is not a v5 quote", path)
	}
	bodySize := int(le.Uint32(b[50:]))
	body := b[54 : 54+bodySize]
	sig := b[54+bodySize+4:]
	// Signature (64), attestation key (64), certification data type (2)
	// and size (4), then the QE report (384), its signature (64), the QE
	// authentication data (2 + n), the PCK chain type (2) and size (4).
	qe := sig[64+64+6:]
	qeAuth := int(le.Uint16(qe[384+64:]))
	chain := qe[384+64+2+qeAuth+6:]
	var certs []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, chain = pem.Decode(chain); blk == nil {
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		certs = append(certs, c)
	}
	if len(certs) != 3 {
		t.Fatalf("%d certificates in the PCK chain", len(certs))
	}
	return tdxPlatform{
		PCK: certs[0], PCKCA: certs[1],
		TeeTCBSVN: body[0:16], MRSignerSeam: body[64:112], SeamAttributes: body[112:120],
		QE: qeReport{MiscSelect: le.Uint32(qe[16:]), Attributes: qe[48:64], MRSigner: qe[128:160], ISVProdID: uint32(le.Uint16(qe[256:])), ISVSVN: uint32(le.Uint16(qe[258:]))},
	}
}

func mustPool(t *testing.T) *x509.CertPool {
	p, err := intelRoot()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func poolOf(c *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c)
	return p
}

func copyDir(t *testing.T, src string) string {
	dst := t.TempDir()
	entries, _ := os.ReadDir(src)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(src, e.Name()))
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func synthCert(t *testing.T, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, serial int64) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: parent == nil || strings.Contains(cn, "CA"), BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}
