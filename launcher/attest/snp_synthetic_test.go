package attest

// Synthetic SNP evidence, for what no public genuine sample shows: a
// Siena (Genoa-line, CPUID model A0h) report that go-sev-guest alone
// refuses (the genuine Siena report is testdata/snp/siena-v5-lunal), a
// revoked chain, a host without a network. Every chain here is
// go-sev-guest's test-only AMD signer (sevtest), never AMD's; the tests
// say so in their names.

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	sevtest "github.com/google/go-sev-guest/testing"
	"github.com/google/go-sev-guest/verify"

	"github.com/c8s-dev/c8s/launcher/attest/fakecvm"
	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

var synthTCB = kds.TCBParts{BlSpl: 10, TeeSpl: 0, SnpSpl: 23, UcodeSpl: 84}

// synthSigner is a test-only AMD chain for productName whose VCEK is
// certified for synthTCB and chip; its ASK may sign CRLs.
func synthSigner(t *testing.T, productName string, chip []byte) *sevtest.AmdSigner {
	t.Helper()
	now := time.Now().Add(-time.Hour)
	b := &sevtest.AmdSignerBuilder{
		Keys: sevtest.DefaultAmdKeys(), ProductName: productName, CSPID: "c8s-test",
		ArkCreationTime: now, AskCreationTime: now, AsvkCreationTime: now, VcekCreationTime: now, VlekCreationTime: now,
		AskCustom:  sevtest.CertOverride{KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign},
		VcekCustom: sevtest.CertOverride{Extensions: sevtest.CustomExtensions(synthTCB, chip, "", productName)},
	}
	s, err := b.TestOnlyCertChain()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// synthReport is a version 3 report from a processor of CPUID cpuid on
// chip, at synthTCB, signed by s's VCEK.
func synthReport(t *testing.T, s *sevtest.AmdSigner, cpuid snpext.CPUID, chip []byte, nonce []byte) ([]byte, *Policy) {
	t.Helper()
	tcb := fakecvm.TCBValue(t, synthTCB)
	var rd [64]byte
	copy(rd[:], nonce)
	raw, err := abi.ReportToAbiBytes(&spb.Report{
		Version: 3, Policy: 0x30000, SignatureAlgo: abi.SignEcdsaP384Sha384, ReportData: rd[:], Measurement: fakecvm.Digest,
		FamilyId: make([]byte, 16), ImageId: make([]byte, 16), HostData: make([]byte, 32), IdKeyDigest: make([]byte, 48),
		AuthorKeyDigest: make([]byte, 48), ReportId: make([]byte, 32), ReportIdMa: make([]byte, 32), ChipId: chip,
		CurrentTcb: tcb, ReportedTcb: tcb, CommittedTcb: tcb, LaunchTcb: tcb, PlatformInfo: 1, Signature: make([]byte, abi.SignatureSize),
	})
	if err != nil {
		t.Fatal(err)
	}
	raw[0x188], raw[0x189], raw[0x18A] = cpuid.Family, cpuid.Model, cpuid.Stepping
	resign(t, s, raw)
	return raw, &Policy{Measurements: map[int]Hex{1: fakecvm.Digest}, Nonce: nonce, MinTCB: tcb}
}

func resign(t *testing.T, s *sevtest.AmdSigner, raw []byte) {
	t.Helper()
	r, sig, err := s.Sign(abi.SignedComponent(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := abi.SetSignature(r, sig, raw); err != nil {
		t.Fatal(err)
	}
}

func synthVerifier(t *testing.T, s *sevtest.AmdSigner, crls ...[]byte) *Verifier {
	t.Helper()
	v, err := NewVerifier(Trust{Mode: ModeSNP, SNPRoots: fakecvm.RootsPEM(s), AMDCRLs: crls})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func synthChip() []byte {
	chip := make([]byte, 64)
	copy(chip, "a synthetic chip")
	return chip
}

// SYNTHETIC: a Siena report (family 19h, model A0h) with a Genoa-line VCEK
// verifies as Genoa; go-sev-guest v0.15.0 cannot verify it (product line
// "Unknown"). The genuine Siena report (testdata/snp/siena-v5-lunal,
// TestGenuineSienaTCB) shows the same with AMD's roots.
func TestSyntheticSienaReport(t *testing.T) {
	chip := synthChip()
	s := synthSigner(t, "Genoa", chip)
	nonce := []byte("siena nonce")
	raw, p := synthReport(t, s, snpext.CPUID{Family: 0x19, Model: 0xA0, Stepping: 2}, chip, nonce)
	table := snpTable(snpext.VCEK, s.Vcek.Raw)
	c, err := synthVerifier(t, s).VerifySNP(raw, table, p)
	if err != nil {
		t.Fatalf("Siena: %v", err)
	}
	if c.ProductLine != snpext.Genoa {
		t.Fatalf("product line %q", c.ProductLine)
	}
	// go-sev-guest alone refuses it: the gap snpext fills.
	att, err := parseSNP(raw, table)
	if err != nil {
		t.Fatal(err)
	}
	roots, _ := synthVerifier(t, s).snpTrustedRoots()
	if err := verify.SnpAttestation(att, &verify.Options{DisableCertFetching: true, TrustedRoots: roots}); err == nil {
		t.Fatal("go-sev-guest verifies Siena reports now: drop the Siena mapping (snpext)")
	}
	bad := append([]byte(nil), raw...)
	bad[0x50] ^= 1 // REPORT_DATA
	_, err = synthVerifier(t, s).VerifySNP(bad, table, &Policy{Measurements: p.Measurements, Nonce: bad[0x50:0x60], MinTCB: p.MinTCB})
	wantErr(t, err, KindSignature, "report signature")
	// A Milan chain for the Siena (Genoa-line) report.
	milan := synthSigner(t, "Milan-B1", chip)
	_, err = synthVerifier(t, milan).VerifySNP(raw, snpTable(snpext.VCEK, milan.Vcek.Raw), p)
	wantErr(t, err, KindSignature, "VCEK certificate chain", "issued by SEV-Genoa")
}

func synthCRL(t *testing.T, issuer *x509.Certificate, key any, next time.Time, revoked ...*big.Int) []byte {
	t.Helper()
	tmpl := &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: time.Now().Add(-time.Hour), NextUpdate: next}
	for _, n := range revoked {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: n, RevocationTime: time.Now().Add(-time.Minute)})
	}
	// CreateRevocationList wants the issuer's subject key id for the
	// CRL's authority key id; the test-only AMD certificates have none.
	iss := *issuer
	if len(iss.SubjectKeyId) == 0 {
		iss.SubjectKeyId = []byte("synthetic")
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, &iss, key.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// SYNTHETIC: an AMD-style CRL signed by the (test) ARK revokes the ASK;
// one signed by the ASK revokes the VCEK; a stale CRL fails closed; a CRL
// of an unknown signer is a configuration error. (No genuine AMD CRL that
// revokes anything is public.)
func TestSyntheticRevokedChain(t *testing.T) {
	chip := synthChip()
	s := synthSigner(t, "Milan-B1", chip)
	raw, p := synthReport(t, s, snpext.CPUID{Family: 0x19, Model: 0x01, Stepping: 1}, chip, []byte("crl nonce"))
	table := snpTable(snpext.VCEK, s.Vcek.Raw)
	day := time.Now().Add(24 * time.Hour)

	clean := synthCRL(t, s.Ark, s.Keys.Ark, day, big.NewInt(0x7777))
	if _, err := synthVerifier(t, s, clean).VerifySNP(raw, table, p); err != nil {
		t.Fatalf("a CRL revoking another serial: %v", err)
	}
	askRevoked := synthCRL(t, s.Ark, s.Keys.Ark, day, s.Ask.SerialNumber)
	_, err := synthVerifier(t, s, askRevoked).VerifySNP(raw, table, p)
	wantErr(t, err, KindRevoked, "ASK", "SEV-Milan", "revoked")
	vcekRevoked := synthCRL(t, s.Ask, s.Keys.Ask, day, s.Vcek.SerialNumber)
	_, err = synthVerifier(t, s, vcekRevoked).VerifySNP(raw, table, p)
	wantErr(t, err, KindRevoked, "VCEK", "SEV-VCEK", "revoked")
	stale := synthCRL(t, s.Ark, s.Keys.Ark, time.Now().Add(-time.Minute))
	_, err = synthVerifier(t, s, stale).VerifySNP(raw, table, p)
	wantErr(t, err, KindConfig, "AMD Milan CRL", "out of date")
	// Signed by another (test) ARK.
	otherKeys := sevtest.DefaultAmdKeys()
	other := fakecvm.Signer(t, otherKeys)
	if _, err := NewVerifier(Trust{Mode: ModeSNP, SNPRoots: fakecvm.RootsPEM(s), AMDCRLs: [][]byte{synthCRL(t, other.Ark, other.Keys.Ark, day)}}); err == nil {
		// DefaultAmdKeys are fixed keys: a CRL by the same key verifies.
		t.Log("same test keys: the other signer's CRL verifies")
	}
	if _, err := NewVerifier(Trust{Mode: ModeSNP, AMDCRLs: [][]byte{clean}}); err == nil {
		t.Fatal("a CRL of a test ARK accepted against AMD's roots")
	}
	if _, err := NewVerifier(Trust{Mode: ModeSim, SimCertChain: []byte("x"), AMDCRLs: [][]byte{clean}}); err == nil {
		t.Fatal("AMD CRLs in sim mode")
	}
}

// A pod without init data: HOST_DATA must be zero; AnyHostData leaves it
// to the caller.
func TestSNPHostDataZeroWithoutInitData(t *testing.T) {
	f := newFixture(t)
	p := f.policy
	p.HostData = nil
	_, err := simVerifier(t, f.sp).VerifySNP(f.report(t), f.sp.CertTable(), &p)
	wantErr(t, err, KindMismatch, "HOST_DATA", "no init data")
	p.AnyHostData = true
	if _, err := simVerifier(t, f.sp).VerifySNP(f.report(t), f.sp.CertTable(), &p); err != nil {
		t.Fatal(err)
	}
	f.req.HostData = [32]byte{}
	p.AnyHostData = false
	if _, err := simVerifier(t, f.sp).VerifySNP(f.report(t), f.sp.CertTable(), &p); err != nil {
		t.Fatalf("HOST_DATA zero without init data: %v", err)
	}
}

// Fetching without a network fails at once, as a network error, not after
// go-sev-guest's two minutes of retries and not as a signature error.
func TestSNPFetchFailsFast(t *testing.T) {
	smp := readSample(t, "milan-v3-oak", snpext.VCEK)
	p := smp.policyFrom()
	// A proxy that refuses connections, and one that never answers.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hang.Close()
	go func() { // accept, never answer
		var held []net.Conn
		for {
			c, err := hang.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	for _, proxy := range []string{"http://" + closedAddr, "http://" + hang.Addr().String()} {
		t.Setenv("HTTPS_PROXY", proxy)
		v, err := NewVerifier(Trust{Mode: ModeSNP, FetchCertificates: true, FetchTimeout: 500 * time.Millisecond, Now: func() time.Time { return smp.at }})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = v.VerifySNP(smp.report, nil, p) // no certificate table: the VCEK is fetched
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("took %v", d)
		}
		wantErr(t, err, KindNetwork, "VCEK from AMD's KDS", "no network")
		_, err = FetchAMDCRL(context.Background(), "Genoa", newKDSGetter(500*time.Millisecond))
		wantErr(t, err, KindNetwork, "AMD Genoa CRL")
	}
	// The KDS address of the VCEK, per product line.
	if u, _ := vcekURL(snpext.Turin, append([]byte{0x3b, 0x42, 0x09, 0x2f, 0x69, 0xc6, 0x56, 0xd3}, make([]byte, 56)...),
		snpext.TCB{Line: snpext.Turin, Bootloader: 1, SNP: 2, Microcode: 71}); u != "https://kdsintf.amd.com/vcek/v1/Turin/3b42092f69c656d3?fmcSPL=0&blSPL=1&teeSPL=0&snpSPL=2&ucodeSPL=71" {
		t.Errorf("Turin VCEK URL %s", u)
	}
	if _, err := vcekURL(snpext.Milan, make([]byte, 64), snpext.TCB{}); err == nil {
		t.Error("a masked CHIP_ID gave a VCEK URL")
	}
}

// SYNTHETIC: with AMD CRLs in the collateral, evidence from a product line
// none of them covers is refused: collateral fetched for other machines
// must not let this one's revocation go unjudged.
func TestRevocationNeedsTheLinesCRL(t *testing.T) {
	s := synthSigner(t, "Genoa", synthChip())
	e := &snpEndorsement{line: "Genoa", key: snpext.VCEK, ark: s.Ark, ica: s.Ask, cert: s.Vcek}
	now, day := time.Now(), &x509.RevocationList{NextUpdate: time.Now().Add(24 * time.Hour)}
	if err := checkSNPRevocation(nil, e, now); err != nil {
		t.Fatalf("no CRLs at all (revocation not configured): %v", err)
	}
	other := []*amdCRL{{line: "Milan", issuer: s.Ark, crl: day}}
	err := checkSNPRevocation(other, e, now)
	wantErr(t, err, KindConfig, "AMD CRL", "Genoa", "collateral fetch --amd Genoa")
	for _, issuer := range []*x509.Certificate{s.Ark, s.Ask} {
		own := append(slices.Clone(other), &amdCRL{line: "Genoa", issuer: issuer, crl: day})
		if err := checkSNPRevocation(own, e, now); err != nil {
			t.Fatalf("with a CRL of the Genoa chain (%s's): %v", issuer.Subject.CommonName, err)
		}
	}
}
