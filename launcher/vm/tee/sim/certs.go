package sim

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"math/big"
	"time"

	"github.com/c8s-dev/c8s/launcher/vm/tee/sim/simtrust"
	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
)

const (
	// ProductLine is the AMD product line the simulated chip claims
	// (simtrust.ProductLine).
	ProductLine = simtrust.ProductLine
	// ProductName is the VCEK product name extension (Milan, stepping B1).
	ProductName = "Milan-B1"
	// ARKCommonName is the simulated root's common name.
	ARKCommonName = simtrust.ARKCommonName
	// SimMarker is the description attribute (OID 2.5.4.13) in the subject of
	// every certificate of a simulated chain.
	SimMarker = simtrust.SimMarker

	// rsaBits is the size of the ARK and ASK keys (AMD's are RSA-4096).
	rsaBits = 4096
	// Validity periods, as AMD's KDS issues them (ARK/ASK 25 years, VCEK 7).
	rootValidity = 25 * 365 * 24 * time.Hour
	vcekValidity = 7 * 365 * 24 * time.Hour
)

// DefaultTCB is the TCB a new simulated chip reports: realistic Milan
// security patch levels.
var DefaultTCB = kds.TCBParts{BlSpl: 3, TeeSpl: 0, SnpSpl: 8, UcodeSpl: 115}

// amdName is the subject or issuer name AMD's KDS certificates carry (go-sev-guest
// checks the location fields and the common name), plus the simulation marker.
func amdName(cn string) pkix.Name {
	return pkix.Name{
		Country:            []string{"US"},
		Province:           []string{"CA"},
		Locality:           []string{"Santa Clara"},
		Organization:       []string{"Advanced Micro Devices"},
		OrganizationalUnit: []string{"Engineering"},
		CommonName:         cn,
		ExtraNames:         []pkix.AttributeTypeAndValue{{Type: simtrust.DescriptionOID, Value: SimMarker}},
	}
}

// IsSimulated reports whether cert carries the simulation marker
// (simtrust.IsSimulated).
func IsSimulated(cert *x509.Certificate) bool { return simtrust.IsSimulated(cert) }

// keys are the private keys of one simulated identity.
type keys struct {
	ark, ask *rsa.PrivateKey
	vcek     *ecdsa.PrivateKey
}

func newKeys() (*keys, error) {
	ark, err := rsa.GenerateKey(rand.Reader, rsaBits)
	if err != nil {
		return nil, fmt.Errorf("sim: generating the ARK key: %w", err)
	}
	ask, err := rsa.GenerateKey(rand.Reader, rsaBits)
	if err != nil {
		return nil, fmt.Errorf("sim: generating the ASK key: %w", err)
	}
	vcek, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sim: generating the VCEK key: %w", err)
	}
	return &keys{ark: ark, ask: ask, vcek: vcek}, nil
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("sim: certificate serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// chain are the certificates of one simulated identity.
type chain struct {
	ark, ask, vcek *x509.Certificate
}

// newChain issues the ARK (self-signed), the ASK (by the ARK) and the VCEK
// (by the ASK, with the KDS extensions for chipID and tcb), all signed with
// RSASSA-PSS SHA-384 as AMD's are.
func newChain(k *keys, chipID [abi.ChipIDSize]byte, tcb kds.TCBParts, now time.Time) (*chain, error) {
	notBefore := now.Add(-time.Hour).UTC()
	crl := kds.CrlLinkByRole(ProductLine, "ARK")
	var serials [3]*big.Int
	for i := range serials {
		s, err := serial()
		if err != nil {
			return nil, err
		}
		serials[i] = s
	}
	arkTmpl := &x509.Certificate{
		SerialNumber:          serials[0],
		Subject:               amdName(ARKCommonName),
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(rootValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SignatureAlgorithm:    x509.SHA384WithRSAPSS,
		CRLDistributionPoints: []string{crl},
	}
	ark, err := issue(arkTmpl, arkTmpl, &k.ark.PublicKey, k.ark)
	if err != nil {
		return nil, fmt.Errorf("sim: issuing the ARK: %w", err)
	}
	askTmpl := &x509.Certificate{
		SerialNumber:          serials[1],
		Subject:               amdName("SEV-" + ProductLine),
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(rootValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SignatureAlgorithm:    x509.SHA384WithRSAPSS,
		CRLDistributionPoints: []string{crl},
	}
	ask, err := issue(askTmpl, ark, &k.ask.PublicKey, k.ark)
	if err != nil {
		return nil, fmt.Errorf("sim: issuing the ASK: %w", err)
	}
	exts, err := vcekExtensions(chipID, tcb)
	if err != nil {
		return nil, err
	}
	// The VCEK carries only KDS extensions (go-sev-guest rejects any other but
	// the authority key id): no key usage, no basic constraints.
	vcekTmpl := &x509.Certificate{
		SerialNumber:       serials[2],
		Subject:            amdName("SEV-VCEK"),
		NotBefore:          notBefore,
		NotAfter:           notBefore.Add(vcekValidity),
		SignatureAlgorithm: x509.SHA384WithRSAPSS,
		ExtraExtensions:    exts,
	}
	vcek, err := issue(vcekTmpl, ask, &k.vcek.PublicKey, k.ask)
	if err != nil {
		return nil, fmt.Errorf("sim: issuing the VCEK: %w", err)
	}
	return &chain{ark: ark, ask: ask, vcek: vcek}, nil
}

func issue(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) (*x509.Certificate, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// vcekExtensions are the AMD KDS extensions of a VCEK certificate: struct
// version, product name, the eight TCB security patch levels and the HWID
// (the chip id).
func vcekExtensions(chipID [abi.ChipIDSize]byte, tcb kds.TCBParts) ([]pkix.Extension, error) {
	var exts []pkix.Extension
	addInt := func(oid asn1.ObjectIdentifier, v int) error {
		b, err := asn1.Marshal(v)
		if err != nil {
			return err
		}
		exts = append(exts, pkix.Extension{Id: oid, Value: b})
		return nil
	}
	name, err := asn1.MarshalWithParams(ProductName, "ia5")
	if err != nil {
		return nil, fmt.Errorf("sim: product name extension: %w", err)
	}
	exts = append(exts, pkix.Extension{Id: kds.OidProductName1, Value: name})
	for _, e := range []struct {
		oid asn1.ObjectIdentifier
		v   uint8
	}{
		{kds.OidStructVersion, 0}, // AMD issues 0 for Milan and Genoa (1 is Turin's layout)
		{kds.OidBlSpl, tcb.BlSpl},
		{kds.OidTeeSpl, tcb.TeeSpl},
		{kds.OidSpl4, tcb.Spl4},
		{kds.OidSpl5, tcb.Spl5},
		{kds.OidSpl6, tcb.Spl6},
		{kds.OidSpl7, tcb.Spl7},
		{kds.OidSnpSpl, tcb.SnpSpl},
		{kds.OidUcodeSpl, tcb.UcodeSpl},
	} {
		if err := addInt(e.oid, int(e.v)); err != nil {
			return nil, fmt.Errorf("sim: VCEK extension %v: %w", e.oid, err)
		}
	}
	// AMD's KDS puts the raw 64 bytes in the HWID extension, untagged.
	exts = append(exts, pkix.Extension{Id: kds.OidHwid, Value: append([]byte(nil), chipID[:]...)})
	return exts, nil
}
