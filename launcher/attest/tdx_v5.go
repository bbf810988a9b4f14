package attest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"

	tdxabi "github.com/google/go-tdx-guest/abi"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"google.golang.org/protobuf/proto"
)

// TDX quote format 5 (Intel TDX DCAP Quoting Library API, "Quote Format
// v5"), which TDX 1.5 platforms produce: the 48-byte header of format 4,
// then a body descriptor (type, u16; size, u32) and the body: a TD report
// 1.0 (type 2, 584 bytes, format 4's body) or a TD report 1.5 (type 3, 648
// bytes: the 1.0 fields, then TEE_TCB_SVN2 and MRSERVICETD). The signature
// data that follows is format 4's. The quote's ECDSA signature covers the
// header, the body descriptor and the body.
//
// go-tdx-guest (v0.3.1, the newest) parses and verifies format 4 only.
// A v5 quote is read here into go-tdx-guest's QuoteV4 representation (the
// header with version 5, the 1.0 fields, the signature data), which the
// rest of the verifier judges as it judges a v4 quote, plus what format 5
// adds; its signatures are verified here, by verifyTDXQuoteV5.
const (
	tdxHeaderSize        = 48
	tdxBodyDescSize      = 6
	tdReport10Size       = 584
	tdReport15Size       = 648
	tdxBodyTypeTDReport  = 2
	tdxBodyTypeTDReport5 = 3
	tdxQuoteVersion5     = 5
	// qeReportSize and the signature and key sizes of ECDSA-256-with-P-256.
	qeReportSize = 384
	p256Size     = 64
)

// tdxQuoteV5 is a parsed v5 quote: what go-tdx-guest's QuoteV4 holds, and
// what format 5 adds.
type tdxQuoteV5 struct {
	q *tdxpb.QuoteV4
	// bodyType is tdxBodyTypeTDReport or tdxBodyTypeTDReport5.
	bodyType uint16
	// teeTCBSVN2 and mrServiceTD are the TD report 1.5's (nil in a 1.0
	// body).
	teeTCBSVN2, mrServiceTD []byte
	// signed is what the attestation key signed; qeReport the QE report
	// as the PCK signed it.
	signed, qeReport []byte
}

// tdxQuoteVersion reads a quote's format version; 0 if too short.
func tdxQuoteVersion(quote []byte) uint16 {
	if len(quote) < 2 {
		return 0
	}
	return binary.LittleEndian.Uint16(quote)
}

// parseTDXQuoteV5 parses a v5 quote. Its body and signature data are laid
// out as the v4 quote go-tdx-guest reads, so that its parser and checks
// (sizes, the header's key and TEE types, the certification data) read the
// signature data; the header keeps version 5.
func parseTDXQuoteV5(quote []byte) (_ *tdxQuoteV5, err error) {
	defer recoverMalformed("TDX quote", &err)
	bad := func(format string, a ...any) error {
		return failure(KindFormat, "TDX quote", fmt.Errorf(format, a...), "a truncated quote, or a quote format this verifier does not know")
	}
	le := binary.LittleEndian
	if len(quote) < tdxHeaderSize+tdxBodyDescSize {
		return nil, bad("%d bytes, shorter than a v5 quote's header and body descriptor", len(quote))
	}
	if v := le.Uint16(quote); v != tdxQuoteVersion5 {
		return nil, bad("version %d, not 5", v)
	}
	bodyType := le.Uint16(quote[tdxHeaderSize:])
	bodySize := le.Uint32(quote[tdxHeaderSize+2:])
	want := map[uint16]uint32{tdxBodyTypeTDReport: tdReport10Size, tdxBodyTypeTDReport5: tdReport15Size}[bodyType]
	if want == 0 {
		return nil, bad("v5 body type %d: neither a TD report 1.0 (2) nor 1.5 (3) (an SGX enclave's quote?)", bodyType)
	}
	if bodySize != want {
		return nil, bad("v5 body of type %d is %d bytes, want %d", bodyType, bodySize, want)
	}
	bodyAt := tdxHeaderSize + tdxBodyDescSize
	sigAt := bodyAt + int(bodySize)
	if len(quote) < sigAt+4 {
		return nil, bad("%d bytes, shorter than its body", len(quote))
	}
	body := quote[bodyAt:sigAt]
	sigData := quote[sigAt:] // its length, then the signature data

	// The v4 layout: header (version 4), the 1.0 body, the signature data.
	v4 := make([]byte, 0, tdxHeaderSize+tdReport10Size+len(sigData))
	v4 = append(v4, quote[:tdxHeaderSize]...)
	le.PutUint16(v4, tdxabi.QuoteVersion)
	v4 = append(v4, body[:tdReport10Size]...)
	v4 = append(v4, sigData...)
	parsed, err := tdxabi.QuoteToProto(v4)
	if err != nil {
		return nil, bad("%v", err)
	}
	q, ok := parsed.(*tdxpb.QuoteV4)
	if !ok {
		return nil, bad("unsupported quote type %T", parsed)
	}
	if err := tdxabi.CheckQuoteV4(q); err != nil {
		return nil, bad("%v", err)
	}
	q.GetHeader().Version = tdxQuoteVersion5

	out := &tdxQuoteV5{q: q, bodyType: bodyType, signed: quote[:sigAt]}
	if bodyType == tdxBodyTypeTDReport5 {
		out.teeTCBSVN2 = bytes.Clone(body[tdReport10Size : tdReport10Size+16])
		out.mrServiceTD = bytes.Clone(body[tdReport10Size+16:])
	}
	// The QE report follows the signature, the attestation key and the
	// certification data's type and size.
	qeAt := sigAt + 4 + 2*p256Size + 6
	if len(quote) < qeAt+qeReportSize {
		return nil, bad("%d bytes, shorter than its QE report", len(quote))
	}
	out.qeReport = quote[qeAt : qeAt+qeReportSize]
	return out, nil
}

// verifyTDXQuoteV5 verifies what go-tdx-guest verifies of a v4 quote: the
// PCK certificate chain to one of roots at now; the QE report's signature
// by the PCK; the QE report's binding of the attestation key and the QE
// authentication data; the quote's signature by the attestation key.
func verifyTDXQuoteV5(v5 *tdxQuoteV5, roots *x509.CertPool, now time.Time) error {
	sd := v5.q.GetSignedData()
	qc := sd.GetCertificationData().GetQeReportCertificationData()
	pck, err := verifyPCKChain(qc.GetPckCertificateChainData().GetPckCertChain(), roots, now)
	if err != nil {
		return err
	}
	pckKey, ok := pck.PublicKey.(*ecdsa.PublicKey)
	if !ok || pckKey.Curve != elliptic.P256() {
		return fmt.Errorf("the PCK certificate's key is %T, not ECDSA P-256", pck.PublicKey)
	}
	if !verifyP256(pckKey, v5.qeReport, qc.GetQeReportSignature()) {
		return errors.New("the QE report's signature does not verify with the PCK certificate's key")
	}
	bound := sha256.Sum256(append(bytes.Clone(sd.GetEcdsaAttestationKey()), qc.GetQeAuthData().GetData()...))
	if rd := qc.GetQeReport().GetReportData(); len(rd) != 64 || !bytes.Equal(rd[:32], bound[:]) || !bytes.Equal(rd[32:], make([]byte, 32)) {
		return errors.New("the QE report does not bind the quote's attestation key and QE authentication data")
	}
	key, err := p256Key(sd.GetEcdsaAttestationKey())
	if err != nil {
		return err
	}
	if !verifyP256(key, v5.signed, sd.GetSignature()) {
		return errTDXQuoteSignature
	}
	return nil
}

// verifyPCKChain verifies a quote's PCK certificate chain as go-tdx-guest
// does a v4 quote's and returns the PCK certificate. It must be exactly
// the PCK certificate, the PCK CA that issued it and the root that issued
// that, in that order, named as Intel names them, and verify to one of
// roots at now with only that CA as intermediate: collateral reads the
// second certificate as the PCK's CA (its CRL, its revocation), so a chain
// that verified through another CA would be judged by the wrong CRL.
func verifyPCKChain(pemChain []byte, roots *x509.CertPool, now time.Time) (*x509.Certificate, error) {
	chain, err := pemCertificates(pemChain)
	if err != nil {
		return nil, err
	}
	if len(chain) != 3 {
		return nil, fmt.Errorf("the PCK certificate chain holds %d certificates, want 3: the PCK's, its CA's and the root's", len(chain))
	}
	pck, ca, root := chain[0], chain[1], chain[2]
	if pck.Subject.CommonName != pckCertCN || (ca.Subject.CommonName != pckPlatformCACN && ca.Subject.CommonName != pckProcessorCACN) {
		return nil, fmt.Errorf("the PCK certificate chain names %q issued by %q: want %q issued by %q or %q",
			pck.Subject.CommonName, ca.Subject.CommonName, pckCertCN, pckPlatformCACN, pckProcessorCACN)
	}
	for i, c := range chain {
		if c.PublicKeyAlgorithm != x509.ECDSA || c.SignatureAlgorithm != x509.ECDSAWithSHA256 {
			return nil, fmt.Errorf("the PCK certificate chain's certificate %d (%q) is not ECDSA with SHA-256", i, c.Subject.CommonName)
		}
	}
	for _, link := range [][2]*x509.Certificate{{pck, ca}, {ca, root}} {
		if !bytes.Equal(link[0].RawIssuer, link[1].RawSubject) {
			return nil, fmt.Errorf("the PCK certificate chain: %q names %q as its issuer, not the next certificate, %q", link[0].Subject.CommonName, link[0].Issuer.CommonName, link[1].Subject.CommonName)
		}
	}
	inter := x509.NewCertPool()
	inter.AddCert(ca)
	paths, err := pck.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now})
	if err != nil {
		return nil, fmt.Errorf("the PCK certificate chain: %w", err)
	}
	for _, p := range paths {
		if len(p) == 3 && p[1].Equal(ca) && p[2].Equal(root) {
			return pck, nil
		}
	}
	return nil, errors.New("the PCK certificate chain: its root is not the trusted root it verifies to")
}

// The subjects' common names of Intel's PCK certificates.
const (
	pckCertCN        = "Intel SGX PCK Certificate"
	pckPlatformCACN  = "Intel SGX PCK Platform CA"
	pckProcessorCACN = "Intel SGX PCK Processor CA"
)

// errTDXQuoteSignature: the attestation key did not sign the header and
// body.
var errTDXQuoteSignature = errors.New("the quote's signature does not verify over its header and body")

// pemCertificates parses the PEM certificates of a PCK certificate chain.
func pemCertificates(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return certs, nil
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("the PCK certificate chain: %w", err)
		}
		certs = append(certs, c)
	}
}

// p256Key reads a raw P-256 public key (X and Y, 32 bytes each).
func p256Key(raw []byte) (*ecdsa.PublicKey, error) {
	if len(raw) != p256Size {
		return nil, fmt.Errorf("attestation key of %d bytes, want %d", len(raw), p256Size)
	}
	k, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append([]byte{4}, raw...))
	if err != nil {
		return nil, fmt.Errorf("the attestation key: %w", err)
	}
	return k, nil
}

// verifyP256 verifies a raw ECDSA-P256-SHA256 signature (r and s, 32
// bytes each) of msg.
func verifyP256(key *ecdsa.PublicKey, msg, sig []byte) bool {
	if len(sig) != p256Size {
		return false
	}
	sum := sha256.Sum256(msg)
	return ecdsa.Verify(key, sum[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:]))
}

// checkServiceTD refuses a TD bound to a service TD (MRSERVICETD not
// zero): a bound service TD, such as a migration TD, acts on the TD's
// state, and c8s binds none. Nil (a v4 quote) and a TD report 1.0 have
// none.
func (v5 *tdxQuoteV5) checkServiceTD() error {
	if v5 == nil || len(v5.mrServiceTD) == 0 || bytes.Equal(v5.mrServiceTD, make([]byte, len(v5.mrServiceTD))) {
		return nil
	}
	return &Error{Kind: KindPolicy, Field: "MRSERVICETD", Expected: Hex(make([]byte, len(v5.mrServiceTD))).String(), Actual: Hex(v5.mrServiceTD).String(),
		Hint: "the host bound a service TD (a migration TD?) to the TD, which can act on its state; c8s binds none"}
}

// asV4 returns q as go-tdx-guest's field validation reads it: its checks
// of a v4 quote's header (the version among them) and of the TD report 1.0
// fields apply to a v5 quote's, whose signatures verifyTDXQuoteV5 checked.
func asV4(q *tdxpb.QuoteV4) *tdxpb.QuoteV4 {
	if q.GetHeader().GetVersion() != tdxQuoteVersion5 {
		return q
	}
	c := proto.Clone(q).(*tdxpb.QuoteV4)
	c.GetHeader().Version = tdxabi.QuoteVersion
	return c
}
