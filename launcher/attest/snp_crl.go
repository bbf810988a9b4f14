package attest

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-sev-guest/verify/trust"

	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

// AMDCRLFilePrefix starts the names of AMD CRL files in a collateral
// directory: AMDCRLFilePrefix + lower-case product line + ".der" for the
// VCEK chain's CRL (FetchAMDCRL), + "_vlek.der" for the VLEK chain's
// (FetchAMDVLEKCRL). AMDCRLFile builds them.
const AMDCRLFilePrefix = "amd_crl_"

// AMDCRLFile is the file name of a product line's CRL in a collateral
// directory.
func AMDCRLFile(productLine string, vlek bool) string {
	name := AMDCRLFilePrefix + strings.ToLower(productLine)
	if vlek {
		name += "_vlek"
	}
	return name + ".der"
}

// LoadAMDCRLs reads the AMD CRL files in a collateral directory (the
// AMDCRLFile names; a missing one is skipped), for Trust.AMDCRLs.
func LoadAMDCRLs(dir string) ([][]byte, error) {
	var out [][]byte
	for line := range amdBundles {
		for _, vlek := range []bool{false, true} {
			b, err := os.ReadFile(filepath.Join(dir, AMDCRLFile(line, vlek)))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("attest: AMD CRL: %w", err)
			}
			out = append(out, b)
		}
	}
	return out, nil
}

// amdCRL is a CRL whose issuer is one of the verifier's SNP roots.
type amdCRL struct {
	line   string
	issuer *x509.Certificate
	crl    *x509.RevocationList
}

func (c *amdCRL) name() string {
	return fmt.Sprintf("AMD %s CRL of %s", c.line, c.issuer.Subject.CommonName)
}

// parseAMDCRL reads a CRL (DER, or PEM "X509 CRL") and finds which root
// certificate signed it: an ARK (its CRL revokes ASKs and ASVKs, as AMD's
// KDS publishes) or an ASK or ASVK (revoking V[CL]EKs).
func parseAMDCRL(b []byte, roots map[string][]*trust.AMDRootCerts) (*amdCRL, error) {
	if blk, _ := pem.Decode(b); blk != nil {
		b = blk.Bytes
	}
	crl, err := x509.ParseRevocationList(b)
	if err != nil {
		return nil, failure(KindFormat, "AMD CRL", err, "want the DER the KDS serves at vcek/v1/<product>/crl")
	}
	for line, rs := range roots {
		for _, r := range rs {
			pc := r.ProductCerts
			if pc == nil {
				continue
			}
			for _, issuer := range []*x509.Certificate{pc.Ark, pc.Ask, pc.Asvk} {
				if issuer != nil && crl.CheckSignatureFrom(issuer) == nil {
					return &amdCRL{line: line, issuer: issuer, crl: crl}, nil
				}
			}
		}
	}
	return nil, &Error{Kind: KindConfig, Field: "AMD CRL", Actual: "issued by " + crl.Issuer.CommonName,
		Err: errors.New("not signed by the ARK, ASK or ASVK of any product line this verifier trusts"), Hint: "a CRL of AMD's KDS for a product line c8s knows"}
}

// parseAMDCRLs parses Trust.AMDCRLs against the verifier's roots.
func parseAMDCRLs(bs [][]byte, roots map[string][]*trust.AMDRootCerts) ([]*amdCRL, error) {
	var out []*amdCRL
	for _, b := range bs {
		c, err := parseAMDCRL(b, roots)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// checkSNPRevocation refuses an endorsement whose intermediate (ASK or
// ASVK) is revoked by its ARK's CRL, or whose V[CL]EK is revoked by a CRL
// of that intermediate; a CRL past its next update is refused, so that a
// stale file does not pass for a current one.
//
// With CRLs at all, one of the report's own chain (its product line's ARK
// or intermediate) is required: collateral fetched for other machines
// must not pass evidence from this one unchecked.
func checkSNPRevocation(crls []*amdCRL, e *snpEndorsement, now time.Time) error {
	covered := len(crls) == 0
	for _, c := range crls {
		if c.line != e.line {
			continue
		}
		var target *x509.Certificate
		var role string
		switch {
		case c.issuer.Equal(e.ark):
			target, role = e.ica, intermediateRole(e.key)
			covered = true
		case c.issuer.Equal(e.ica):
			target, role = e.cert, string(e.key)
			covered = true
		default:
			continue
		}
		if !c.crl.NextUpdate.IsZero() && now.After(c.crl.NextUpdate) {
			return &Error{Kind: KindConfig, Field: c.name(), Expected: "next update after " + now.UTC().Format(time.RFC3339),
				Actual: c.crl.NextUpdate.UTC().Format(time.RFC3339), Hint: "the CRL is out of date: fetch a current one (c8s-launcher collateral fetch)"}
		}
		for _, r := range c.crl.RevokedCertificateEntries {
			if r.SerialNumber.Cmp(target.SerialNumber) == 0 {
				return &Error{Kind: KindRevoked, Field: role, Expected: "not revoked",
					Actual: fmt.Sprintf("%s serial %#x revoked at %s", target.Subject.CommonName, target.SerialNumber, r.RevocationTime.UTC().Format(time.RFC3339)),
					Hint:   revokedHint(c, role, e.key)}
			}
		}
	}
	if !covered {
		return &Error{Kind: KindConfig, Field: "AMD CRL", Expected: "a CRL of the " + e.line + " certificate chain", Actual: "CRLs of other chains only",
			Hint: fmt.Sprintf("the report comes from a %s machine, whose certificates' revocation the collateral cannot judge: fetch its CRL (c8s-launcher collateral fetch --amd %s)", e.line, e.line)}
	}
	return nil
}

func revokedHint(c *amdCRL, role string, key snpext.Key) string {
	if role == string(key) {
		return fmt.Sprintf("the %s revokes the %s that signed this report", c.name(), key)
	}
	return fmt.Sprintf("the %s revokes the %s that certifies this report's %s", c.name(), role, key)
}
