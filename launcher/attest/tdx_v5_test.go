package attest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// v5Time is within the validity of the genuine v5 quote's PCK chain.
var v5Time = func() time.Time { return time.Date(2026, time.March, 1, 0, 0, 0, 0, time.UTC) }

// The genuine v5 quote (dcap-qvl's tdx_quote_outdated: TD report 1.5 of a
// production platform) verifies: its PCK chain under Intel's root, the QE
// report's and the quote's signatures, read by this package since
// go-tdx-guest knows v4 only.
func TestTDXQuoteV5Genuine(t *testing.T) {
	quote, p := quotePolicy(t, dcapOutdated)
	c, err := tdxVerifierAt(t, v5Time, nil).VerifyTDX(quote, p)
	if err != nil {
		t.Fatalf("the genuine v5 quote: %v", err)
	}
	if c.QuoteVersion != 5 || c.TDReport != "1.5" || len(c.TeeTCBSVN2) != 16 || len(c.MRServiceTD) != 48 || len(c.RTMRs) != 4 || c.MRTD.String() != Hex(p.MRTD).String() {
		t.Errorf("claims %+v", c)
	}
	// The same fields as the v4 reader's where the formats agree: the
	// collateral test's reading of the raw bytes.
	pl := platformOfV5(t, dcapOutdated)
	q, _ := ParseTDXQuote(quote)
	if got := q.GetTdQuoteBody().GetTeeTcbSvn(); string(got) != string(pl.TeeTCBSVN) || string(q.GetTdQuoteBody().GetMrSignerSeam()) != string(pl.MRSignerSeam) {
		t.Errorf("TEE_TCB_SVN %x, MRSIGNERSEAM %x; the raw bytes hold %x, %x", got, q.GetTdQuoteBody().GetMrSignerSeam(), pl.TeeTCBSVN, pl.MRSignerSeam)
	}
	// With its genuine collateral, its platform is below every TCB level.
	_, err = tdxVerifierAt(t, v5Time, loadColl(t, coll90C06F)).VerifyTDX(quote, p)
	var e *Error
	if !errors.As(err, &e) || e.Field != "TDX TCB status" || e.Actual != "no matching TCB level" {
		t.Fatalf("the v5 quote with its collateral: %v, want no matching TCB level", err)
	}
}

// Every byte the attestation key signed counts: the header, the body
// descriptor and the whole TD report 1.5 (TEE_TCB_SVN2 and MRSERVICETD
// after the 1.0 fields); the QE report is the PCK's.
func TestTDXQuoteV5Altered(t *testing.T) {
	quote, p := quotePolicy(t, dcapOutdated)
	for _, tc := range []struct {
		name string
		at   int
		want string
	}{
		{"header user data", 30, "signature does not verify"},
		{"MRTD", 54 + 136, "signature does not verify"},
		{"TEE_TCB_SVN2", 54 + 584, "signature does not verify"},
		{"MRSERVICETD", 54 + 600 + 47, "signature does not verify"},
		{"QE report", 54 + 648 + 4 + 128 + 6 + 100, "QE report's signature"},
	} {
		b := append([]byte(nil), quote...)
		b[tc.at] ^= 1
		pp := *p
		if tc.name == "MRTD" {
			pp.MRTD = append([]byte(nil), p.MRTD...)
			pp.MRTD[0] ^= 1
		}
		_, err := tdxVerifierAt(t, v5Time, nil).VerifyTDX(b, &pp)
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindSignature || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s altered: %v, want a signature error naming %q", tc.name, err, tc.want)
		}
	}
	// An untrusted root: the same quote under another root is refused.
	v := tdxVerifierAt(t, v5Time, nil)
	root, _ := synthCert(t, "another root", nil, nil, 1)
	v.tdxRoots = poolOf(root)
	if _, err := v.VerifyTDX(quote, p); kindOf(err) != KindSignature || !strings.Contains(err.Error(), "PCK certificate chain") {
		t.Errorf("another root: %v", err)
	}
}

func TestTDXQuoteV5Malformed(t *testing.T) {
	quote, _ := os.ReadFile(dcapOutdated)
	le := binary.LittleEndian
	for _, tc := range []struct {
		name string
		edit func([]byte) []byte
		want string
	}{
		{"SGX body", func(b []byte) []byte { le.PutUint16(b[48:], 1); return b }, "body type 1"},
		{"short body", func(b []byte) []byte { le.PutUint32(b[50:], 584); return b }, "is 584 bytes, want 648"},
		{"truncated", func(b []byte) []byte { return b[:700] }, "shorter than its body"},
		{"no body", func(b []byte) []byte { return b[:50] }, "shorter than a v5 quote's header"},
		{"cut signature data", func(b []byte) []byte { return b[:1200] }, "TDX quote"},
	} {
		b := tc.edit(append([]byte(nil), quote...))
		_, err := ParseTDXQuote(b)
		if kindOf(err) != KindFormat || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a format error naming %q", tc.name, err, tc.want)
		}
	}
}

// A TD the host bound to a service TD (a migration TD can export its
// memory) is refused. SYNTHETIC: no genuine quote with MRSERVICETD set is
// public, so the genuine v5 quote's header and body, MRSERVICETD set, are
// signed here under a test chain standing in for Intel's (synthTDX).
func TestTDXQuoteV5ServiceTDRefused(t *testing.T) {
	genuine, p := quotePolicy(t, dcapOutdated)
	s := newSynthTDX(t)
	if _, err := s.v.VerifyTDX(s.sign(t, genuine[:54+648]), p); err != nil {
		t.Fatalf("re-signed genuine header and body: %v", err)
	}
	unsigned := append([]byte(nil), genuine[:54+648]...)
	unsigned[54+600] = 0x5e
	_, err := s.v.VerifyTDX(s.sign(t, unsigned), p)
	var e *Error
	if !errors.As(err, &e) || e.Field != "MRSERVICETD" || e.Kind != KindPolicy {
		t.Fatalf("a bound service TD: %v, want MRSERVICETD refused", err)
	}
	t.Log(err)
}

// The QE report, signed by the PCK, must bind the attestation key that
// signed the quote: a report of Intel's QE binding another key (or the
// key with trailing bytes) does not vouch for this one.
func TestTDXQuoteV5QEReportBindsTheKey(t *testing.T) {
	genuine, p := quotePolicy(t, dcapOutdated)
	s := newSynthTDX(t)
	for name, edit := range map[string]func([]byte){
		"another key's hash": func(qe []byte) { qe[320] ^= 1 },
		"trailing bytes":     func(qe []byte) { qe[383] = 1 },
	} {
		_, err := s.v.VerifyTDX(s.sign(t, genuine[:54+648], edit), p)
		if kindOf(err) != KindSignature || !strings.Contains(err.Error(), "does not bind the quote's attestation key") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// synthTDX signs v5 quotes under a test chain standing in for Intel's
// (named as Intel names its certificates): a verifier that trusts its root,
// and sign, which appends v5 signature data to a header and body: a quote
// signed by an attestation key that a QE report of Intel's TD QE identity
// binds, that report signed by the PCK key.
type synthTDX struct {
	v      *Verifier
	root   *x509.Certificate
	rootK  *ecdsa.PrivateKey
	pckK   *ecdsa.PrivateKey
	attK   *ecdsa.PrivateKey
	chain  []*x509.Certificate // the PCK chain the quote carries
	qeBase []byte
	auth   []byte
}

func newSynthTDX(t *testing.T) *synthTDX {
	t.Helper()
	s := &synthTDX{auth: []byte("qe authentication data")}
	s.root, s.rootK = synthCert(t, "Intel SGX Root CA", nil, nil, 1)
	ca, caK := synthCert(t, pckPlatformCACN, s.root, s.rootK, 2)
	var pck *x509.Certificate
	pck, s.pckK = synthCert(t, pckCertCN, ca, caK, 3)
	s.chain = []*x509.Certificate{pck, ca, s.root}
	s.v = tdxVerifierAt(t, time.Now, nil)
	s.v.tdxRoots = poolOf(s.root)
	s.attK, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	s.qeBase = make([]byte, qeReportSize)
	s.qeBase[48] = 0x11 // ATTRIBUTES: INIT, MODE64BIT
	copy(s.qeBase[128:], tdQEMRSigner)
	binary.LittleEndian.PutUint16(s.qeBase[256:], uint16(tdQEProdID))
	bound := sha256.Sum256(append(rawP256(s.attK), s.auth...))
	copy(s.qeBase[320:], bound[:])
	return s
}

func rawP256(k *ecdsa.PrivateKey) []byte {
	b, _ := k.PublicKey.Bytes() // 0x04 || X || Y
	return b[1:]
}

func rawSig(t *testing.T, k *ecdsa.PrivateKey, msg []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(msg)
	r, s, err := ecdsa.Sign(rand.Reader, k, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 64)
	r.FillBytes(out[:32])
	s.FillBytes(out[32:])
	return out
}

func (s *synthTDX) sign(t *testing.T, hb []byte, qeEdits ...func([]byte)) []byte {
	t.Helper()
	le := binary.LittleEndian
	qe := append([]byte(nil), s.qeBase...)
	for _, edit := range qeEdits {
		edit(qe)
	}
	var chain []byte
	for _, c := range s.chain {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	var cert []byte
	cert = append(cert, qe...)
	cert = append(cert, rawSig(t, s.pckK, qe)...)
	cert = le.AppendUint16(cert, uint16(len(s.auth)))
	cert = append(cert, s.auth...)
	cert = le.AppendUint16(cert, 5) // PCK certificate chain
	cert = le.AppendUint32(cert, uint32(len(chain)))
	cert = append(cert, chain...)
	var sd []byte
	sd = append(sd, rawSig(t, s.attK, hb)...)
	sd = append(sd, rawP256(s.attK)...)
	sd = le.AppendUint16(sd, 6) // QE report certification data
	sd = le.AppendUint32(sd, uint32(len(cert)))
	sd = append(sd, cert...)
	out := append([]byte(nil), hb...)
	out = le.AppendUint32(out, uint32(len(sd)))
	return append(out, sd...)
}

// The PCK chain is exactly the PCK, the CA that issued it and the root,
// in order: collateral judges the PCK's revocation by the second
// certificate's CRL. A PCK of the Processor CA carried with the Platform
// CA second (the Processor CA third, as an extra intermediate) verified
// through the Processor CA and would have been judged by the Platform
// CA's CRL, on which a revoked Processor-CA PCK is not.
func TestMaliciousHostReordersThePCKChain(t *testing.T) {
	genuine, p := quotePolicy(t, dcapOutdated)
	hb := genuine[:54+648]
	s := newSynthTDX(t)
	platform := s.chain[1]
	processor, procK := synthCert(t, pckProcessorCACN, s.root, s.rootK, 4)
	var pck *x509.Certificate
	pck, s.pckK = synthCert(t, pckCertCN, processor, procK, 5)
	s.chain = []*x509.Certificate{pck, processor, s.root}
	if _, err := s.v.VerifyTDX(s.sign(t, hb), p); err != nil {
		t.Fatalf("the Processor CA's PCK in order: %v", err)
	}
	for name, chain := range map[string][]*x509.Certificate{
		"another CA second, the issuer third": {pck, platform, processor, s.root},
		"another CA second":                   {pck, platform, s.root},
		"no root":                             {pck, processor},
		"root first":                          {s.root, processor, pck},
	} {
		s.chain = chain
		_, err := s.v.VerifyTDX(s.sign(t, hb), p)
		if kindOf(err) != KindSignature || !strings.Contains(err.Error(), "PCK certificate chain") {
			t.Errorf("%s: %v, want the PCK chain refused", name, err)
		}
	}
}
