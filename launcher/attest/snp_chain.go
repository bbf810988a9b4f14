package attest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/c8s-dev/c8s/launcher/attest/snpext"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim/simtrust"
)

// snpEndorsement is a report's verified signing key: a VCEK or VLEK
// certificate that chains to the verifier's roots for the report's product
// line and that signed the report.
type snpEndorsement struct {
	key  snpext.Key
	line string
	cert *x509.Certificate
	exts *snpext.Extensions
	// ica and ark are the intermediate (ASK or ASVK) and root the chain was
	// verified with (now or, cached, before).
	ica, ark *x509.Certificate
	// upstream: go-sev-guest v0.15.0 can verify this report and its key
	// too (Milan and Genoa of the CPUID models it knows), and does.
	upstream bool
}

// verifySNPEndorsement finds the report's product line and signing key,
// checks the key's chain (and revocation) and the report's signature.
func (v *Verifier) verifySNPEndorsement(raw []byte, att *spb.Attestation) (*snpEndorsement, error) {
	info, err := abi.ParseSignerInfo(att.GetReport().GetSignerInfo())
	if err != nil {
		return nil, failure(KindFormat, "report signer info", err, "")
	}
	chain := att.GetCertificateChain()
	var e snpEndorsement
	var der []byte
	switch info.SigningKey {
	case abi.VcekReportSigner:
		e.key, der = snpext.VCEK, chain.GetVcekCert()
	case abi.VlekReportSigner:
		e.key, der = snpext.VLEK, chain.GetVlekCert()
		if v.trust.Mode == ModeSim {
			return nil, failure(KindRoot, "report signing key", errors.New("signed by the VLEK, the simulated secure processor signs with its VCEK"), "")
		}
		if len(der) == 0 {
			return nil, failure(KindFormat, "certificate table", errors.New("no VLEK certificate"),
				"a VLEK-signed report needs the certificate table its host (cloud provider) provisioned: AMD's KDS does not serve VLEKs")
		}
	default:
		return nil, failure(KindFormat, "report signing key", fmt.Errorf("%v", info.SigningKey), "the report is not signed by a VCEK or VLEK")
	}
	var cert *x509.Certificate
	if len(der) != 0 {
		if cert, err = trust.ParseCert(der); err != nil {
			return nil, failure(KindFormat, string(e.key)+" certificate", err, "")
		}
	}
	if e.line, err = snpReportLine(raw, cert); err != nil {
		return nil, err
	}
	if cert == nil {
		if der, err = v.fetchVCEK(att.GetReport(), e.line); err != nil {
			return nil, err
		}
		if cert, err = trust.ParseCert(der); err != nil {
			return nil, failure(KindFormat, "VCEK certificate (fetched)", err, "")
		}
		chain.VcekCert = der
	}
	e.cert = cert
	if err := v.checkSimRoot(e.key, cert); err != nil {
		return nil, err
	}
	if err := checkKeyCert(&e); err != nil {
		return nil, err
	}
	if e.exts, err = snpext.ParseExtensions(cert, e.key, e.line); err != nil {
		return nil, failure(KindFormat, string(e.key)+" certificate", err, "")
	}
	if err := checkChipID(att.GetReport(), &e); err != nil {
		return nil, err
	}
	e.upstream = upstreamHandles(raw, e.line)
	cached, hit := v.cachedVCEK(der)
	if !hit {
		if err := v.verifyKeyChain(&e); err != nil {
			return nil, err
		}
	} else {
		e.cert, e.ica, e.ark = cached.cert, cached.ica, cached.ark
	}
	// Every time, cached or not: a CRL past its next update, or one that
	// revokes the chain since, fails a chip seen before too.
	if err := checkSNPRevocation(v.amdCRLs, &e, v.now()); err != nil {
		return nil, err
	}
	if err := v.fetchedRevocation(&e); err != nil {
		return nil, err
	}
	if err := verify.SnpReportSignature(raw, e.cert); err != nil {
		return nil, failure(KindSignature, "report signature", err, "the report was altered after it was signed, or signed by another key")
	}
	if !hit {
		if e.upstream {
			if err := v.verifyUpstream(att); err != nil {
				return nil, err
			}
		}
		v.cacheVCEK(verifiedChain{cert: e.cert, ica: e.ica, ark: e.ark})
	}
	return &e, nil
}

// snpReportLine is the report's product line: from its CPUID (version 3
// and later), else from its key certificate's product name.
func snpReportLine(raw []byte, cert *x509.Certificate) (string, error) {
	if c, ok := snpext.ReportCPUID(raw); ok {
		line, err := snpext.ProductLine(c)
		if err != nil {
			return "", &Error{Kind: KindFormat, Field: "CPUID", Actual: c.String(), Err: err}
		}
		return line, nil
	}
	if cert == nil {
		return "", failure(KindFormat, "certificate table", errors.New("a version 2 report names no processor and came without its VCEK"),
			"send the report with its certificate table (extended report)")
	}
	line, err := snpext.CertProductLine(cert)
	if err != nil {
		return "", failure(KindFormat, "VCEK certificate", err, "")
	}
	return line, nil
}

// checkSimRoot keeps simulated and genuine chains apart.
func (v *Verifier) checkSimRoot(key snpext.Key, c *x509.Certificate) error {
	switch s := simtrust.IsSimulated(c); {
	case s && v.trust.Mode != ModeSim:
		return failure(KindRoot, "report signing key", fmt.Errorf("the %s is issued by a c8s SIMULATED secure processor (test only)", key),
			"this verifier is configured for hardware ("+string(v.trust.Mode)+") and trusts AMD's roots only")
	case !s && v.trust.Mode == ModeSim:
		return failure(KindRoot, "report signing key", fmt.Errorf("the %s is not from a c8s simulated secure processor", key),
			"this verifier is configured for sim and trusts the node's simulated root only")
	}
	return nil
}

// checkKeyCert checks what AMD's KDS specifies for every V[CL]EK
// certificate: X.509 v3, RSASSA-PSS with SHA-384 by its intermediate, an
// ECDSA P-384 key, subject SEV-VCEK or SEV-VLEK, issued by the report's
// product line's ASK or ASVK.
func checkKeyCert(e *snpEndorsement) error {
	c := e.cert
	field := string(e.key) + " certificate chain"
	fail := func(format string, args ...any) error {
		return &Error{Kind: KindSignature, Field: field, Err: fmt.Errorf(format, args...), Hint: rootsHint(e.key, e.line, true)}
	}
	if c.Version != 3 {
		return fail("%s certificate version %d, AMD issues version 3", e.key, c.Version)
	}
	if c.SignatureAlgorithm != x509.SHA384WithRSAPSS {
		return fail("%s signed with %v, AMD signs with SHA-384 RSASSA-PSS", e.key, c.SignatureAlgorithm)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P384() {
		return fail("%s key is not ECDSA P-384", e.key)
	}
	if want := "SEV-" + string(e.key); c.Subject.CommonName != want {
		return fail("subject %q, want %q", c.Subject.CommonName, want)
	}
	if want := intermediateName(e.key, e.line); c.Issuer.CommonName != want {
		return &Error{Kind: KindSignature, Field: field, Expected: "issued by " + want, Actual: "issued by " + c.Issuer.CommonName,
			Hint: fmt.Sprintf("the report comes from a %s processor (its CPUID, or its %s's product name); this %s belongs to another product line", e.line, e.key, e.key)}
	}
	return nil
}

// verifyKeyChain verifies the key certificate with the line's intermediate
// (ASK for a VCEK, ASVK for a VLEK) and ARK among the verifier's roots.
func (v *Verifier) verifyKeyChain(e *snpEndorsement) error {
	roots, err := v.snpTrustedRoots()
	if err != nil {
		return err
	}
	field := string(e.key) + " certificate chain"
	candidates := roots[e.line]
	if len(candidates) == 0 {
		return &Error{Kind: KindRoot, Field: field, Actual: e.line, Err: fmt.Errorf("this verifier trusts no %s roots", e.line),
			Hint: "a simulated or test root covers one product line only"}
	}
	var lastErr error
	for _, r := range candidates {
		pc := r.ProductCerts
		if pc == nil || pc.Ark == nil {
			continue
		}
		ica := pc.Ask
		if e.key == snpext.VLEK {
			ica = pc.Asvk
		}
		if ica == nil {
			lastErr = fmt.Errorf("the %s roots have no %s, which certifies %ss", e.line, intermediateRole(e.key), e.key)
			continue
		}
		ints, rs := x509.NewCertPool(), x509.NewCertPool()
		ints.AddCert(ica)
		rs.AddCert(pc.Ark)
		if _, err := e.cert.Verify(x509.VerifyOptions{Intermediates: ints, Roots: rs, CurrentTime: v.now(),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			lastErr = err
			continue
		}
		e.ica, e.ark = ica, pc.Ark
		return nil
	}
	hint := rootsHint(e.key, e.line, v.usesAMDRoots())
	if v.trust.Mode == ModeSim {
		hint = "the report comes from another node's simulated secure processor, or the node's simulated identity was re-created"
	}
	return &Error{Kind: KindSignature, Field: field, Err: lastErr, Hint: hint}
}

// upstreamHandles reports whether go-sev-guest v0.15.0 can verify and
// validate the report itself: Milan and Genoa, of a CPUID model its
// product table has (a version 2 report takes the product from the VCEK).
func upstreamHandles(raw []byte, line string) bool {
	if line != snpext.Milan && line != snpext.Genoa {
		return false
	}
	r, err := abi.ReportToProto(raw)
	if err != nil {
		return false
	}
	fms := r.GetCpuid1EaxFms()
	return fms == 0 || kds.ProductLineFromFms(fms) == line
}

// verifyUpstream has go-sev-guest verify the chain and signature as well,
// with the same roots (both intermediates) and no network.
func (v *Verifier) verifyUpstream(att *spb.Attestation) error {
	roots, err := v.snpTrustedRoots()
	if err != nil {
		return err
	}
	if err := verify.SnpAttestationContext(context.Background(), att, &verify.Options{
		DisableCertFetching: true,
		Now:                 v.now(),
		TrustedRoots:        roots,
	}); err != nil {
		return failure(KindSignature, "certificate chain (go-sev-guest)", err, "go-sev-guest refuses what c8s's own checks accepted: report this")
	}
	return nil
}

// fetchVCEK fetches the report's VCEK from AMD's KDS, if allowed.
func (v *Verifier) fetchVCEK(r *spb.Report, line string) ([]byte, error) {
	if v.trust.Mode == ModeSim || !v.trust.FetchCertificates {
		return nil, failure(KindFormat, "certificate table", errors.New("no VCEK certificate"),
			"send the report with the certificate table of an extended report request, or allow fetching certificates")
	}
	addr, err := vcekURL(line, r.GetChipId(), snpext.DecomposeTCB(r.GetReportedTcb(), line))
	if err != nil {
		return nil, failure(KindFormat, "certificate table", err, "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), v.fetchTimeout())
	defer cancel()
	return fetch(ctx, v.getter(), "VCEK from AMD's KDS", addr)
}

// fetchedRevocation fetches and checks the line's CRL when the verifier
// fetches collateral and has no CRL file for it. A fetched CRL serves
// until its next update (fetchedCRLMaxAge at most), then is fetched again.
func (v *Verifier) fetchedRevocation(e *snpEndorsement) error {
	if v.trust.Mode != ModeSNP || !v.trust.FetchCertificates || e.ark == nil {
		return nil
	}
	for _, c := range v.amdCRLs {
		if c.line == e.line && c.issuer.Equal(e.ark) {
			return nil
		}
	}
	key := e.line + "/" + string(e.key)
	v.mu.Lock()
	f := v.fetched[key]
	v.mu.Unlock()
	c := f.crl
	if f.stale(v.now()) {
		ctx, cancel := context.WithTimeout(context.Background(), v.fetchTimeout())
		defer cancel()
		der, err := fetchAMDCRL(ctx, e.line, e.key, v.getter())
		if err != nil {
			return err
		}
		roots, err := v.snpTrustedRoots()
		if err != nil {
			return err
		}
		if c, err = parseAMDCRL(der, roots); err != nil {
			return err
		}
		v.mu.Lock()
		if v.fetched == nil {
			v.fetched = map[string]fetchedCRL{}
		}
		v.fetched[key] = fetchedCRL{crl: c, at: v.now()}
		v.mu.Unlock()
	}
	return checkSNPRevocation([]*amdCRL{c}, e, v.now())
}

// stale reports whether f is to be fetched again at now: none yet, or
// past its next update or fetchedCRLMaxAge, and not fetched within
// fetchedCRLRetry (a KDS still serving an out-of-date CRL is asked once a
// minute, and the CRL fails each report meanwhile).
func (f fetchedCRL) stale(now time.Time) bool {
	if f.crl == nil {
		return true
	}
	age := now.Sub(f.at)
	if age <= fetchedCRLRetry {
		return false
	}
	next := f.crl.crl.NextUpdate
	return age > fetchedCRLMaxAge || !next.IsZero() && now.After(next)
}

// A fetched CRL serves until its next update, and a day at most (one
// with no next update too).
const (
	fetchedCRLMaxAge = 24 * time.Hour
	fetchedCRLRetry  = time.Minute
)

func (v *Verifier) fetchTimeout() time.Duration {
	if v.trust.FetchTimeout > 0 {
		return v.trust.FetchTimeout
	}
	return DefaultFetchTimeout
}

func (v *Verifier) getter() trust.HTTPSGetter { return newKDSGetter(v.fetchTimeout()) }
