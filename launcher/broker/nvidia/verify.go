package nvidia

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha512"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	_ "embed"
)

// rootPEM is NVIDIA's device identity root CA ("NVIDIA Device Identity
// CA"), the root of every GPU's device certificate chain, as Trustee's
// NVIDIA verifier pins it (deps/verifier/src/nvidia/nvidia_device_root.pem;
// testdata/NOTICE).
//
//go:embed nvidia_device_root.pem
var rootPEM []byte

// Root returns NVIDIA's device identity root CA.
func Root() *x509.Certificate {
	b, _ := pem.Decode(rootPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		panic("nvidia: the embedded root does not parse: " + err.Error())
	}
	return c
}

// oidFWID is the TCG DICE FWID extension (tcg-dice-TcbInfo's FWID list),
// whose last 48 bytes are the GPU firmware's SHA-384 FWID.
var oidFWID = asn1.ObjectIdentifier{2, 23, 133, 5, 4, 1}

// Claims are what a verified report shows.
type Claims struct {
	// Arch is "hopper".
	Arch string `json:"arch"`
	// Measurements are the measurement blocks' values, hex, by index.
	Measurements  map[int]string `json:"measurements"`
	DriverVersion string         `json:"driver_version"`
	VBIOSVersion  string         `json:"vbios_version"`
	FWID          string         `json:"fwid"`
	// Leaf is the device certificate's subject (its serial number names
	// the GPU).
	Leaf string `json:"leaf"`
}

// Options are a verification's inputs besides the evidence.
type Options struct {
	// Nonce is the 32-byte nonce the report's request must carry.
	Nonce []byte
	// Roots are the trusted roots (nil: Root()).
	Roots *x509.CertPool
	// Now is the time certificates must be valid at (zero: time.Now()).
	Now time.Time
}

// VerifyHopper verifies a Hopper report against its PEM certificate
// chain (see the package doc).
func VerifyHopper(report, chainPEM []byte, o Options) (*Claims, error) {
	if len(o.Nonce) != NonceSize {
		return nil, fmt.Errorf("nvidia: the expected nonce is %d bytes, want %d", len(o.Nonce), NonceSize)
	}
	r, err := ParseReport(report, HopperSignatureSize)
	if err != nil {
		return nil, err
	}
	leaf, err := verifyChain(chainPEM, o)
	if err != nil {
		return nil, err
	}
	fwid, err := leafFWID(leaf)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(fwid, r.FWID()) {
		return nil, fmt.Errorf("nvidia: the device certificate's FWID %x is not the report's %x: the report is not from the firmware the certificate names", fwid, r.FWID())
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("nvidia: the device certificate's key is %T, want ECDSA P-384", leaf.PublicKey)
	}
	digest := sha512.Sum384(r.Signed)
	rs, ss := new(big.Int).SetBytes(r.Signature[:48]), new(big.Int).SetBytes(r.Signature[48:])
	if !ecdsa.Verify(pub, digest[:], rs, ss) {
		return nil, errors.New("nvidia: the report's signature does not verify with the device certificate's key")
	}
	if !bytes.Equal(r.Nonce[:], o.Nonce) {
		return nil, fmt.Errorf("nvidia: the report's nonce %x is not the session's %x (a replayed or foreign report)", r.Nonce, o.Nonce)
	}
	c := &Claims{Arch: "hopper", Measurements: map[int]string{}, DriverVersion: r.DriverVersion(), VBIOSVersion: r.VBIOSVersion(),
		FWID: hex.EncodeToString(r.FWID()), Leaf: leaf.Subject.String()}
	for _, m := range r.Measurements {
		c.Measurements[int(m.Index)] = hex.EncodeToString(m.Value)
	}
	return c, nil
}

// verifyChain verifies the PEM chain (leaf first, root last) up to the
// trusted roots and returns the leaf.
func verifyChain(chainPEM []byte, o Options) (*x509.Certificate, error) {
	var certs []*x509.Certificate
	for rest := chainPEM; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("nvidia: certificate %d of the chain: %w", len(certs), err)
		}
		certs = append(certs, c)
	}
	if len(certs) < 2 {
		return nil, fmt.Errorf("nvidia: the certificate chain has %d certificates: want the device certificate up to NVIDIA's root", len(certs))
	}
	roots := o.Roots
	if roots == nil {
		roots = x509.NewCertPool()
		roots.AddCert(Root())
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	// The DICE extensions NVIDIA marks critical are checked here (the
	// FWID) or carry no constraint on the chain; Go's verifier knows
	// none of them.
	for _, c := range certs {
		c.UnhandledCriticalExtensions = slicesDeleteDICE(c.UnhandledCriticalExtensions)
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("nvidia: the device certificate chain does not lead to NVIDIA's device identity root: %w", err)
	}
	return leaf, nil
}

// diceArc is the TCG DICE arc (2.23.133.5.4): TcbInfo, UEID and friends.
var diceArc = asn1.ObjectIdentifier{2, 23, 133, 5, 4}

func slicesDeleteDICE(oids []asn1.ObjectIdentifier) []asn1.ObjectIdentifier {
	var out []asn1.ObjectIdentifier
	for _, o := range oids {
		if len(o) > len(diceArc) && o[:len(diceArc)].Equal(diceArc) {
			continue
		}
		out = append(out, o)
	}
	return out
}

// leafFWID reads the FWID from the device certificate.
func leafFWID(c *x509.Certificate) ([]byte, error) {
	for _, e := range c.Extensions {
		if e.Id.Equal(oidFWID) {
			if len(e.Value) < 48 {
				return nil, fmt.Errorf("nvidia: the device certificate's FWID extension is %d bytes", len(e.Value))
			}
			return e.Value[len(e.Value)-48:], nil
		}
	}
	return nil, fmt.Errorf("nvidia: the device certificate (%s) has no FWID extension %s: it is not a GPU's attestation certificate", strings.TrimSpace(c.Subject.String()), oidFWID)
}
