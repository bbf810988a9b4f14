package attest

import (
	"errors"
	"fmt"
	"time"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
	"github.com/c8s-dev/c8s/manifest"
)

// VerifyEvidence verifies a guest's evidence by its kind against p: an
// SNP report (in ModeSim the sim TEE's modelled RTMRs and boot log first,
// VerifySimEvidence; else VerifySNP) or a TDX quote with its event log
// (VerifyTDXEvidence). One of the claims is set when err is nil.
func (v *Verifier) VerifyEvidence(ev verdict.Evidence, p *Policy) (*SNPClaims, *TDXClaims, error) {
	switch ev.Kind {
	case "snp":
		var c *SNPClaims
		var err error
		if v.trust.Mode == ModeSim {
			c, err = v.VerifySimEvidence(ev.Report, ev.CertTable, ev.SimRTMRs, ev.EventLog, p)
		} else {
			c, err = v.VerifySNP(ev.Report, ev.CertTable, p)
		}
		return c, nil, err
	case "tdx":
		c, err := v.VerifyTDXEvidence(ev.Report, ev.EventLog, p)
		return nil, c, err
	}
	return nil, nil, failure(KindFormat, "evidence kind", fmt.Errorf("%q is neither snp nor tdx", ev.Kind), "")
}

// Decide answers a verdict.Request: the policy the image manifest gives
// a VM of the request's TEE and vCPUs, with the init data's digest, the
// REPORT_DATA and the node's settings, checked against each of the
// request's trusts in turn. Only "another root signed it" (KindSignature,
// KindRoot) moves on to the next trust; any other failure is the verdict.
// It is what c8s-verify (ServeVerdict) decides, which the shim runs
// for every attestation so that the verifiers never load into a pod's
// long-lived shim.
func Decide(r *verdict.Request) *verdict.Verdict { return DecideAt(r, nil) }

// DecideAt is Decide with certificates and collateral judged at now()
// (nil: the current time), for recorded evidence in tests.
func DecideAt(r *verdict.Request, now func() time.Time) *verdict.Verdict {
	snp, tdx, err := decide(r, now)
	if err != nil {
		return &verdict.Verdict{Failure: verdict.NewFailure(err)}
	}
	return &verdict.Verdict{SNP: snp, TDX: tdx}
}

func decide(r *verdict.Request, now func() time.Time) (*SNPClaims, *TDXClaims, error) {
	if len(r.Trusts) == 0 {
		return nil, nil, failure(KindConfig, "trust", errors.New("the request names no root of trust"), "")
	}
	if k := r.Evidence.Kind; k != "snp" && k != "tdx" {
		return nil, nil, fmt.Errorf("the guest returned %q evidence from %q, which this node (tee %s) cannot verify", k, r.Evidence.Provider, r.TEE)
	}
	m, err := manifest.Load(r.Manifest)
	if err != nil {
		return nil, nil, fmt.Errorf("attestation needs the image manifest (attestation.manifest): %w", err)
	}
	p, err := PolicyFromManifest(m, r.TEE, r.VCPUs)
	if err != nil {
		return nil, nil, err
	}
	if r.TEE == "tdx" {
		p.MRConfigID = r.MRConfigID
	} else {
		p.HostData = r.HostData
	}
	p.Nonce, p.MinTCB, p.AllowDebug, p.ChipID = r.ReportData, r.MinTCB, r.AllowDebug, r.ChipID
	var errs []error
	for _, t := range r.Trusts {
		trust := Trust{Mode: t.Mode, SimCertChain: t.SimCertChain, Now: now}
		if r.CollateralDir != "" && trust.Mode != ModeSim {
			if err := trust.LoadCollateral(r.CollateralDir); err != nil {
				return nil, nil, fmt.Errorf("attestation.collateral_dir: %w", err)
			}
		}
		v, err := NewVerifier(trust)
		if err != nil {
			return nil, nil, err
		}
		snp, tdx, err := v.VerifyEvidence(r.Evidence, p)
		if err == nil {
			return snp, tdx, nil
		}
		var ae *Error
		if len(r.Trusts) == 1 || !errors.As(err, &ae) || (ae.Kind != KindSignature && ae.Kind != KindRoot) {
			// Anything but "not this root" is the answer.
			return nil, nil, err
		}
		errs = append(errs, err)
	}
	return nil, nil, fmt.Errorf("the evidence does not verify against any of the %d trusted roots: %w", len(r.Trusts), errors.Join(errs...))
}
