package attest

import (
	"errors"
	"fmt"

	tdxabi "github.com/google/go-tdx-guest/abi"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	tdxvalidate "github.com/google/go-tdx-guest/validate"
	tdxverify "github.com/google/go-tdx-guest/verify"
)

// tdAttributesDebug is TD_ATTRIBUTES bit 0 (byte 0): the TD is debuggable.
const tdAttributesDebug = 0x01

// TDXClaims are the verified contents of a TDX quote.
type TDXClaims struct {
	Mode         Mode   `json:"mode"`
	QuoteVersion uint32 `json:"quote_version"`
	MRTD         Hex    `json:"mrtd"`
	MRConfigID   Hex    `json:"mrconfigid"`
	RTMRs        []Hex  `json:"rtmrs"`
	TDAttributes Hex    `json:"td_attributes"`
	TeeTCBSVN    Hex    `json:"tee_tcb_svn"`
	ReportData   Hex    `json:"report_data"`
}

// ParseTDXQuote parses a TDX quote (version 4) without verifying it.
func ParseTDXQuote(quote []byte) (_ *tdxpb.QuoteV4, err error) {
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

// VerifyTDX verifies a TDX quote against p: the PCK certificate chain to
// Intel's root, the quoting enclave's report and the quote's signature
// (go-tdx-guest verify), then the policy's fields (go-tdx-guest validate).
func (v *Verifier) VerifyTDX(quote []byte, p *Policy) (_ *TDXClaims, err error) {
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
	q, err := ParseTDXQuote(quote)
	if err != nil {
		return nil, err
	}
	if err := tdxverify.TdxQuote(q, &tdxverify.Options{
		GetCollateral:    v.trust.FetchCertificates,
		CheckRevocations: v.trust.FetchCertificates,
		Now:              v.now(),
		TrustedRoots:     v.tdxRoots,
	}); err != nil {
		hint := "the quote was altered, or its PCK certificate chain is not valid under Intel's root at the verification time"
		if errors.Is(err, tdxverify.ErrHashVerificationFail) {
			hint = "the quote's header or TD report was altered after it was signed"
		}
		return nil, failure(KindSignature, "TDX quote signature", err, hint)
	}
	body := q.GetTdQuoteBody()
	if err := checkTDXFields(body, p, wantRD); err != nil {
		return nil, err
	}
	opts := &tdxvalidate.Options{TdQuoteBodyOptions: tdxvalidate.TdQuoteBodyOptions{
		MrTd:       p.MRTD,
		MrConfigID: p.MRConfigID,
		ReportData: wantRD,
	}}
	if len(p.RTMRs) != 0 {
		opts.TdQuoteBodyOptions.Rtmrs = make([][]byte, 4)
		for i, r := range p.RTMRs {
			opts.TdQuoteBodyOptions.Rtmrs[i] = r
		}
	}
	if err := tdxvalidate.TdxQuote(q, opts); err != nil {
		return nil, failure(KindPolicy, "TDX quote validation", err, "")
	}
	c := &TDXClaims{
		Mode:         v.trust.Mode,
		QuoteVersion: q.GetHeader().GetVersion(),
		MRTD:         body.GetMrTd(),
		MRConfigID:   body.GetMrConfigId(),
		TDAttributes: body.GetTdAttributes(),
		TeeTCBSVN:    body.GetTeeTcbSvn(),
		ReportData:   body.GetReportData(),
	}
	for _, r := range body.GetRtmrs() {
		c.RTMRs = append(c.RTMRs, r)
	}
	return c, nil
}

func checkTDXFields(body *tdxpb.TDQuoteBody, p *Policy, wantRD []byte) error {
	if attrs := body.GetTdAttributes(); len(attrs) > 0 && attrs[0]&tdAttributesDebug != 0 && !p.AllowDebug {
		return &Error{Kind: KindPolicy, Field: "TD_ATTRIBUTES DEBUG bit", Expected: "0", Actual: "1 (TD_ATTRIBUTES=" + Hex(attrs).String() + ")",
			Hint: "the TD is debuggable, so the host can read its memory; the policy forbids debug guests"}
	}
	if string(p.MRTD) != string(body.GetMrTd()) {
		return mismatch("MRTD", p.MRTD.String(), Hex(body.GetMrTd()).String(), "the TD firmware (TDVF/OVMF) differs from the manifest?")
	}
	if len(p.MRConfigID) != 0 && string(p.MRConfigID) != string(body.GetMrConfigId()) {
		return mismatch("MRCONFIGID", p.MRConfigID.String(), Hex(body.GetMrConfigId()).String(),
			"the pod's init data differs from the one the TD was launched with")
	}
	rtmrs := body.GetRtmrs()
	for i, want := range p.RTMRs {
		if len(want) == 0 {
			continue
		}
		var got []byte
		if i < len(rtmrs) {
			got = rtmrs[i]
		}
		if string(want) != string(got) {
			return mismatch(fmt.Sprintf("RTMR[%d]", i), want.String(), Hex(got).String(), "the kernel, initrd or command line differs from the manifest?")
		}
	}
	return checkNonce(wantRD, body.GetReportData())
}
