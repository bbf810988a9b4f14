package attest

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"sync"

	"github.com/google/go-sev-guest/verify/trust"

	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

// amdBundles are AMD's ASK/ARK and ASVK/ARK bundles per product line, as
// go-sev-guest embeds them from AMD's KDS (vcek/v1/<line>/cert_chain and
// vlek/v1/<line>/cert_chain).
var amdBundles = map[string]struct{ vcek, vlek []byte }{
	snpext.Milan: {trust.AskArkMilanVcekBytes, trust.AskArkMilanVlekBytes},
	snpext.Genoa: {trust.AskArkGenoaVcekBytes, trust.AskArkGenoaVlekBytes},
	snpext.Turin: {trust.AskArkTurinVcekBytes, trust.AskArkTurinVlekBytes},
}

// amdRoots returns AMD's roots for every product line, each with both
// intermediates: the ASK, which certifies VCEKs, and the ASVK, which
// certifies VLEKs. go-sev-guest's default roots (trust.DefaultRootCerts)
// hold the ASK only, so that a VLEK-signed report never verified with
// them.
var amdRoots = sync.OnceValues(func() (map[string][]*trust.AMDRootCerts, error) {
	out := map[string][]*trust.AMDRootCerts{}
	for line, b := range amdBundles {
		ask, ark, err := parseBundle(b.vcek)
		if err != nil {
			return nil, fmt.Errorf("AMD's %s VCEK roots: %w", line, err)
		}
		asvk, vlekArk, err := parseBundle(b.vlek)
		if err != nil {
			return nil, fmt.Errorf("AMD's %s VLEK roots: %w", line, err)
		}
		if !ark.Equal(vlekArk) {
			return nil, fmt.Errorf("AMD's %s VCEK and VLEK bundles name different ARKs", line)
		}
		if ask.Subject.CommonName != "SEV-"+line || asvk.Subject.CommonName != "SEV-VLEK-"+line || ark.Subject.CommonName != "ARK-"+line {
			return nil, fmt.Errorf("AMD's %s roots are named %q, %q, %q", line, ask.Subject.CommonName, asvk.Subject.CommonName, ark.Subject.CommonName)
		}
		r := trust.AMDRootCertsProduct(line)
		r.ProductCerts = &trust.ProductCerts{Ask: ask, Asvk: asvk, Ark: ark}
		out[line] = []*trust.AMDRootCerts{r}
	}
	return out, nil
})

// parseBundle reads a KDS cert_chain bundle: the intermediate, then the
// ARK, in PEM.
func parseBundle(b []byte) (ica, ark *x509.Certificate, err error) {
	var certs []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) != 2 || len(bytes.TrimSpace(b)) != 0 {
		return nil, nil, fmt.Errorf("want two PEM certificates (intermediate, ARK), got %d and %d other bytes", len(certs), len(bytes.TrimSpace(b)))
	}
	return certs[0], certs[1], nil
}

// snpTrustedRoots returns the roots the verifier checks chains with: the
// configured ones (sim, or Trust.SNPRoots in tests), else AMD's.
func (v *Verifier) snpTrustedRoots() (map[string][]*trust.AMDRootCerts, error) {
	if v.snpRoots != nil {
		return v.snpRoots, nil
	}
	r, err := amdRoots()
	if err != nil {
		return nil, failure(KindConfig, "trust", err, "")
	}
	return r, nil
}

// usesAMDRoots reports whether the verifier trusts AMD's genuine roots (not
// a simulated or test root): the product's default minimum TCB applies.
func (v *Verifier) usesAMDRoots() bool { return v.trust.Mode == ModeSNP && v.snpRoots == nil }

// intermediateName is the common name of the certificate that certifies
// key on line: "SEV-Milan" (ASK) or "SEV-VLEK-Milan" (ASVK).
func intermediateName(key snpext.Key, line string) string {
	if key == snpext.VLEK {
		return "SEV-VLEK-" + line
	}
	return "SEV-" + line
}

// intermediateRole is "ASK" or "ASVK".
func intermediateRole(key snpext.Key) string {
	if key == snpext.VLEK {
		return "ASVK"
	}
	return "ASK"
}

// rootsHint explains which roots a key of line chains to.
func rootsHint(key snpext.Key, line string, amd bool) string {
	if !amd {
		return fmt.Sprintf("the %s does not chain to this verifier's configured %s roots", key, line)
	}
	kind := strings.ToLower(string(key))
	return fmt.Sprintf("a genuine %s chains to AMD's %s and ARK-%s (KDS %s/v1/%s/cert_chain); a %s of another product line or chip, or one not issued by AMD, does not",
		key, intermediateName(key, line), line, kind, line, key)
}
