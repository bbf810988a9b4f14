package attest

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	tdxabi "github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	tdxvalidate "github.com/google/go-tdx-guest/validate"
	tdxverify "github.com/google/go-tdx-guest/verify"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// TDXClaims are the verified contents of a TDX quote (verdict.TDXClaims).
type TDXClaims = verdict.TDXClaims

// ParseTDXQuote parses a TDX quote (version 4 or 5) without verifying it.
// A v5 quote comes as go-tdx-guest's QuoteV4 with header version 5: its
// TD report 1.0 fields and signature data (tdx_v5.go).
func ParseTDXQuote(quote []byte) (_ *tdxpb.QuoteV4, err error) {
	if tdxQuoteVersion(quote) == tdxQuoteVersion5 {
		v5, err := parseTDXQuoteV5(quote)
		if err != nil {
			return nil, err
		}
		return v5.q, nil
	}
	// go-tdx-guest's parser (v0.3.1) can index past the end of a malformed
	// quote; FuzzVerifyTDX found one. Bad input must be an error, not a panic.
	defer recoverMalformed("TDX quote", &err)
	q, err := tdxabi.QuoteToProto(quote)
	if err != nil {
		return nil, failure(KindFormat, "TDX quote", err, "a truncated quote, or a quote format this verifier does not know")
	}
	v4, ok := q.(*tdxpb.QuoteV4)
	if !ok {
		return nil, failure(KindFormat, "TDX quote", fmt.Errorf("unsupported quote type %T", q), "")
	}
	return v4, nil
}

// VerifyTDX verifies a TDX quote with no event log against p; see
// VerifyTDXEvidence.
func (v *Verifier) VerifyTDX(quote []byte, p *Policy) (*TDXClaims, error) {
	return v.VerifyTDXEvidence(quote, nil, p)
}

// VerifyTDXEvidence verifies a TDX quote and the TD's CC event log against
// p: the PCK certificate chain to Intel's root, the quoting enclave's
// report and the quote's signature (go-tdx-guest verify); with collateral
// the platform's TCB status, the quoting enclave's identity and PCK
// revocation; then the policy's fields, the event log's replay to the
// RTMRs and the measured boot it records (Policy.TDXBoot).
func (v *Verifier) VerifyTDXEvidence(quote, eventLog []byte, p *Policy) (_ *TDXClaims, err error) {
	defer recoverMalformed("TDX quote", &err)
	if v.trust.Mode != ModeTDX {
		return nil, failure(KindConfig, "trust", fmt.Errorf("this verifier is configured for %s and accepts no TDX quotes", v.trust.Mode), "")
	}
	if p == nil {
		return nil, configErr("no policy")
	}
	if err := p.checkTDX(); err != nil {
		return nil, err
	}
	wantRD, err := p.reportData()
	if err != nil {
		return nil, err
	}
	q, v5, err := v.verifyTDXSignatures(quote)
	if err != nil {
		return nil, err
	}
	// Whoever signed the quote: with the PCK chain alone, any enclave the
	// host runs with the provisioning key's attribute has its attestation
	// key certified, and signs what it likes.
	pl, err := tdxPlatformOf(q)
	if err != nil {
		return nil, err
	}
	if err := checkTDQE(pl.QE); err != nil {
		return nil, err
	}
	tcb, err := v.checkTDXCollateral(q, p)
	if err != nil {
		return nil, err
	}
	body := q.GetTdQuoteBody()
	if err := checkTDXFields(body, p, wantRD); err != nil {
		return nil, err
	}
	if err := v5.checkServiceTD(); err != nil {
		return nil, err
	}
	// The event log first: its errors name the event, where a plain
	// RTMR comparison could only name the register.
	if err := checkMeasuredBoot(body.GetRtmrs(), eventLog, p.TDXBoot); err != nil {
		return nil, err
	}
	if err := checkRTMRs(body.GetRtmrs(), p.RTMRs); err != nil {
		return nil, err
	}
	opts := &tdxvalidate.Options{TdQuoteBodyOptions: tdxvalidate.TdQuoteBodyOptions{
		MrTd:         p.MRTD,
		MrConfigID:   p.MRConfigID,
		ReportData:   wantRD,
		TdAttributes: p.TDAttributes,
		Xfam:         p.XFAM,
	}}
	if len(p.RTMRs) != 0 {
		opts.TdQuoteBodyOptions.Rtmrs = make([][]byte, 4)
		for i, r := range p.RTMRs {
			opts.TdQuoteBodyOptions.Rtmrs[i] = r
		}
	}
	if err := tdxvalidate.TdxQuote(asV4(q), opts); err != nil {
		return nil, failure(KindPolicy, "TDX quote validation", err, "")
	}
	c := &TDXClaims{
		Mode:             v.trust.Mode,
		QuoteVersion:     q.GetHeader().GetVersion(),
		MRTD:             body.GetMrTd(),
		MRConfigID:       body.GetMrConfigId(),
		TDAttributes:     body.GetTdAttributes(),
		XFAM:             body.GetXfam(),
		TeeTCBSVN:        body.GetTeeTcbSvn(),
		ReportData:       body.GetReportData(),
		EventLogReplayed: len(eventLog) > 0,
		TCB:              tcb,
	}
	if v5 != nil {
		c.TDReport, c.TeeTCBSVN2, c.MRServiceTD = "1.0", v5.teeTCBSVN2, v5.mrServiceTD
		if v5.bodyType == tdxBodyTypeTDReport5 {
			c.TDReport = "1.5"
		}
	}
	for _, r := range body.GetRtmrs() {
		c.RTMRs = append(c.RTMRs, r)
	}
	return c, nil
}

// verifyTDXSignatures parses a quote and verifies its signatures: the
// PCK chain to Intel's root, the QE report's and the quote's. A v4 quote is
// verified by go-tdx-guest, a v5 one here (tdx_v5.go); v5 is nil for v4.
func (v *Verifier) verifyTDXSignatures(quote []byte) (*tdxpb.QuoteV4, *tdxQuoteV5, error) {
	hint := "the quote was altered, or its PCK certificate chain is not valid under Intel's root at the verification time"
	if tdxQuoteVersion(quote) == tdxQuoteVersion5 {
		v5, err := parseTDXQuoteV5(quote)
		if err != nil {
			return nil, nil, err
		}
		if err := verifyTDXQuoteV5(v5, v.tdxRoots, v.now()); err != nil {
			if errors.Is(err, errTDXQuoteSignature) {
				hint = "the quote's header or TD report was altered after it was signed"
			}
			return nil, nil, failure(KindSignature, "TDX quote signature", err, hint)
		}
		return v5.q, v5, nil
	}
	q, err := ParseTDXQuote(quote)
	if err != nil {
		return nil, nil, err
	}
	// Collateral is judged below, by this package, with Intel's files
	// (offline or fetched): go-tdx-guest's own collateral check accepts
	// UpToDate only and fetches without a deadline.
	if err := tdxverify.TdxQuote(q, &tdxverify.Options{
		Now:          v.now(),
		TrustedRoots: v.tdxRoots,
	}); err != nil {
		if errors.Is(err, tdxverify.ErrHashVerificationFail) {
			hint = "the quote's header or TD report was altered after it was signed"
		}
		return nil, nil, failure(KindSignature, "TDX quote signature", err, hint)
	}
	return q, nil, nil
}

// checkTDXCollateral judges the quote's platform with the verifier's
// collateral, or collateral fetched from Intel's PCS; nil, nil without
// either.
func (v *Verifier) checkTDXCollateral(q *tdxpb.QuoteV4, p *Policy) (*TDXTCB, error) {
	coll := v.trust.TDXCollateral
	if coll == nil && !v.trust.FetchCertificates {
		return nil, nil
	}
	pl, err := tdxPlatformOf(q)
	if err != nil {
		return nil, err
	}
	if coll == nil {
		ext, err := pcs.PckCertificateExtensions(pl.PCK)
		if err != nil {
			return nil, failure(KindFormat, "PCK certificate", err, "")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*pcsRequestTimeout)
		defer cancel()
		files, err := v.trust.PCS.FetchTDX(ctx, ext.FMSPC, []string{pckCAOf(pl.PCKCA)})
		if err != nil {
			return nil, err
		}
		if coll, err = NewTDXCollateral(v.trust.PCS.base(), files); err != nil {
			return nil, err
		}
	}
	root, err := intelRootCert()
	if err != nil {
		return nil, failure(KindConfig, "trust", err, "")
	}
	return coll.check(root, pl, v.now(), p.AllowTCBStatus)
}

// tdxPlatformOf reads what collateral judges from a verified quote.
func tdxPlatformOf(q *tdxpb.QuoteV4) (tdxPlatform, error) {
	qc := q.GetSignedData().GetCertificationData().GetQeReportCertificationData()
	certs, err := pemCertificates(qc.GetPckCertificateChainData().GetPckCertChain())
	if err != nil {
		return tdxPlatform{}, failure(KindFormat, "PCK certificate chain", err, "")
	}
	if len(certs) < 2 {
		return tdxPlatform{}, failure(KindFormat, "PCK certificate chain", fmt.Errorf("%d certificates", len(certs)), "")
	}
	body, qe := q.GetTdQuoteBody(), qc.GetQeReport()
	return tdxPlatform{
		PCK: certs[0], PCKCA: certs[1],
		TeeTCBSVN: body.GetTeeTcbSvn(), MRSignerSeam: body.GetMrSignerSeam(), SeamAttributes: body.GetSeamAttributes(),
		QE: qeReport{MiscSelect: qe.GetMiscSelect(), Attributes: qe.GetAttributes(), MRSigner: qe.GetMrSigner(), ISVProdID: qe.GetIsvProdId(), ISVSVN: qe.GetIsvSvn()},
	}, nil
}

func pckCAOf(ca *x509.Certificate) string {
	if strings.Contains(ca.Subject.CommonName, "Processor") {
		return "processor"
	}
	return "platform"
}

// checkRTMRs compares the RTMRs with the policy's (an empty entry is not
// checked).
func checkRTMRs(rtmrs [][]byte, want []Hex) error {
	for i, w := range want {
		if len(w) == 0 {
			continue
		}
		var got []byte
		if i < len(rtmrs) {
			got = rtmrs[i]
		}
		if string(w) != string(got) {
			hint := "the kernel, initrd or command line differs from the manifest?"
			if i == 3 {
				hint = "something in the TD extended RTMR3, which c8s's guest never does"
			}
			return mismatch(fmt.Sprintf("RTMR[%d]", i), w.String(), Hex(got).String(), hint)
		}
	}
	return nil
}

func checkTDXFields(body *tdxpb.TDQuoteBody, p *Policy, wantRD []byte) error {
	if err := checkTDXLaunchAttributes(body.GetTdAttributes(), body.GetXfam(), p); err != nil {
		return err
	}
	if string(p.MRTD) != string(body.GetMrTd()) {
		return mismatch("MRTD", p.MRTD.String(), Hex(body.GetMrTd()).String(), "the TD firmware (TDVF/OVMF) differs from the manifest?")
	}
	if len(p.MRConfigID) != 0 && string(p.MRConfigID) != string(body.GetMrConfigId()) {
		return mismatch("MRCONFIGID", p.MRConfigID.String(), Hex(body.GetMrConfigId()).String(),
			"the pod's init data differs from the one the TD was launched with")
	}
	if err := checkTEETCBSVN(body.GetTeeTcbSvn(), p.MinTEETCBSVN); err != nil {
		return err
	}
	return checkNonce(wantRD, body.GetReportData())
}

// checkTEETCBSVN compares TEE_TCB_SVN byte by byte with the minimum.
func checkTEETCBSVN(got, min Hex) error {
	if len(min) == 0 {
		return nil
	}
	for i := range min {
		if i >= len(got) || got[i] < min[i] {
			return &Error{Kind: KindPolicy, Field: "TEE_TCB_SVN", Expected: "at least " + min.String(), Actual: got.String(),
				Hint: fmt.Sprintf("byte %d (the TDX module's %s) is below the policy's minimum: update the host's TDX module", i, teeTCBSVNByte(i))}
		}
	}
	return nil
}

func teeTCBSVNByte(i int) string {
	switch i {
	case 0:
		return "minor SVN"
	case 1:
		return "major version"
	}
	return "component SVN"
}

// intelRootCert returns Intel's SGX root (intelRootPEM, fingerprint
// checked by intelRoot).
func intelRootCert() (*x509.Certificate, error) {
	if _, err := intelRoot(); err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(intelRootPEM)
	return x509.ParseCertificate(blk.Bytes)
}

// Intel's TD quoting enclave, as its identity in Intel's PCS names it
// (TDX QE identity v2, id TD_QE: testdata/tdx/dcap-qvl/collateral-*/
// tdx_qe_identity.json). Collateral judges the same fields again with
// Intel's current file, and the enclave's TCB level too.
var (
	tdQEMRSigner       = mustDecodeHex("dc9e2a7c6f948f17474e34a7fc43ed030f7c1563f1babddf6340c82e0e54a8c5")
	tdQEAttributes     = mustDecodeHex("11000000000000000000000000000000")
	tdQEAttributesMask = mustDecodeHex("fbffffffffffffff0000000000000000")
)

// tdQEProdID is the TD quoting enclave's ISVPRODID (a var for the tests).
var tdQEProdID uint32 = 2

// checkTDQE refuses a quote whose quoting enclave (its report, which the
// PCK signed and the quote's signature key is bound to) is not Intel's TD
// quoting enclave, or runs as a debug enclave.
func checkTDQE(qe qeReport) error {
	switch {
	case !bytes.Equal(qe.MRSigner, tdQEMRSigner):
		return mismatch("QE MRSIGNER", hex.EncodeToString(tdQEMRSigner), hex.EncodeToString(qe.MRSigner),
			"the quote was signed by an enclave the host ran, not Intel's TD quoting enclave")
	case qe.ISVProdID != tdQEProdID:
		return mismatch("QE ISVPRODID", fmt.Sprint(tdQEProdID), fmt.Sprint(qe.ISVProdID), "the quote was not signed by Intel's TD quoting enclave")
	case qe.MiscSelect != 0: // the identity's MISCSELECT 0, mask FFFFFFFF
		return mismatch("QE MISCSELECT", "00000000", fmt.Sprintf("%08x", qe.MiscSelect), "the quoting enclave runs with features Intel's TD QE does not")
	case !maskedEqual(qe.Attributes, tdQEAttributesMask, tdQEAttributes):
		return mismatch("QE ATTRIBUTES", hex.EncodeToString(tdQEAttributes), hex.EncodeToString(qe.Attributes),
			"the quoting enclave runs with attributes Intel does not accept (a debug enclave?)")
	}
	return nil
}

func mustDecodeHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}
