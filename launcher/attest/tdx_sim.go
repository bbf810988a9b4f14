package attest

import (
	"crypto/ecdsa"
	"crypto/sha512"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/google/go-sev-guest/abi"

	"github.com/c8s-dev/c8s/launcher/vm/tee/sim/simtrust"
)

// VerifySimEvidence verifies the sim TEE's evidence: the measured boot
// first, when the policy names one (Policy.TDXBoot, Policy.RTMRs), then
// the report (VerifySNP). The sim TEE models TDX's RTMRs
// (launcher/vm/tee/sim BootLog): statement binds them to report under the
// simulated VCEK's signature, and eventLog must replay to them and name
// the policy's kernel, command line and initrd, as on TDX.
func (v *Verifier) VerifySimEvidence(report, certTable, statement, eventLog []byte, p *Policy) (*SNPClaims, error) {
	if v.trust.Mode != ModeSim {
		return nil, failure(KindConfig, "trust", fmt.Errorf("this verifier is configured for %s, not the sim TEE", v.trust.Mode), "")
	}
	if p == nil {
		return nil, configErr("no policy")
	}
	if p.TDXBoot != nil || len(p.RTMRs) > 0 {
		if err := p.TDXBoot.check(); err != nil {
			return nil, err
		}
		rtmrs, err := v.simRTMRs(report, certTable, statement)
		if err != nil {
			return nil, err
		}
		if err := checkMeasuredBoot(rtmrs, eventLog, p.TDXBoot); err != nil {
			return nil, err
		}
		if err := checkRTMRs(rtmrs, p.RTMRs); err != nil {
			return nil, err
		}
	}
	return v.VerifySNP(report, certTable, p)
}

// simRTMRs verifies an RTMR statement: the VCEK of the certificate table
// is the simulated secure processor's (signed by the trusted sim ASK), it
// signed the statement, and the statement binds this report.
func (v *Verifier) simRTMRs(report, certTable, statement []byte) ([][]byte, error) {
	if len(statement) == 0 {
		return nil, &Error{Kind: KindPolicy, Field: "sim RTMRs", Expected: "an RTMR statement", Actual: "none",
			Hint: "the policy checks the measured boot and the simulated secure processor modelled no RTMRs (a kernel that is not an EFI-stub PE image?), or the host dropped them"}
	}
	digest, rtmrs, signed, sig, err := simtrust.ParseRTMRStatement(statement)
	if err != nil {
		return nil, failure(KindFormat, "sim RTMRs", err, "")
	}
	if rd := sha512.Sum384(report); rd != digest {
		return nil, mismatch("sim RTMR statement's report", Hex(rd[:]).String(), Hex(digest[:]).String(), "the RTMRs were signed for another report (replayed from another VM?)")
	}
	vcek, err := v.simVCEK(certTable)
	if err != nil {
		return nil, err
	}
	pub, ok := vcek.PublicKey.(*ecdsa.PublicKey)
	d := sha512.Sum384(signed)
	if !ok || !ecdsa.VerifyASN1(pub, d[:], sig) {
		return nil, failure(KindSignature, "sim RTMR statement signature", errors.New("does not verify with the VCEK"), "the RTMRs were altered after the simulated secure processor signed them")
	}
	out := make([][]byte, 4)
	for i := range rtmrs {
		out[i] = rtmrs[i][:]
	}
	return out, nil
}

// simVCEK returns the certificate table's VCEK once the trusted sim ASK
// has been checked to have signed it.
func (v *Verifier) simVCEK(certTable []byte) (*x509.Certificate, error) {
	var t abi.CertTable
	if err := t.Unmarshal(certTable); err != nil {
		return nil, failure(KindFormat, "certificate table", err, "")
	}
	der := certChain(&t).GetVcekCert()
	vcek, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, failure(KindFormat, "VCEK", err, "")
	}
	roots := v.snpRoots[simtrust.ProductLine]
	if len(roots) == 0 || roots[0].ProductCerts == nil || roots[0].ProductCerts.Ask == nil {
		return nil, failure(KindConfig, "trust", errors.New("no simulated ASK"), "")
	}
	ask := roots[0].ProductCerts.Ask
	if err := ask.CheckSignature(vcek.SignatureAlgorithm, vcek.RawTBSCertificate, vcek.Signature); err != nil || !simtrust.IsSimulated(vcek) {
		return nil, failure(KindRoot, "VCEK", fmt.Errorf("not signed by this node's simulated ASK: %v", err), "")
	}
	if now := v.now(); now.Before(vcek.NotBefore) || now.After(vcek.NotAfter) {
		return nil, failure(KindSignature, "VCEK", fmt.Errorf("valid %s to %s", vcek.NotBefore, vcek.NotAfter), "")
	}
	return vcek, nil
}
