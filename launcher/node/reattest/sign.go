package reattest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	jose "github.com/go-jose/go-jose/v4"
)

// BundleType is the JWS "typ" of a signed trust bundle: a signature made
// for anything else, with the same key, is not a bundle.
const BundleType = "c8s-trust-bundle"

// algorithms are the signatures a bundle may carry: Ed25519 and ECDSA
// P-256 with SHA-256.
var algorithms = []jose.SignatureAlgorithm{jose.EdDSA, jose.ES256}

// ParsePublicKeys reads the owner's public keys: one or more PEM "PUBLIC
// KEY" blocks (PKIX), each Ed25519 or ECDSA P-256. More than one key lets
// the owner roll keys over.
func ParsePublicKeys(data []byte) ([]crypto.PublicKey, error) {
	var keys []crypto.PublicKey
	for rest := data; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("owner key: a PEM %q block; want PUBLIC KEY (PKIX)", blk.Type)
		}
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("owner key: %w", err)
		}
		if err := checkKey(k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("owner key: no PEM PUBLIC KEY block")
	}
	return keys, nil
}

// checkKey accepts Ed25519 and ECDSA P-256 public keys.
func checkKey(k crypto.PublicKey) error {
	switch k := k.(type) {
	case ed25519.PublicKey:
		return nil
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() {
			return nil
		}
		return fmt.Errorf("owner key: ECDSA on %s; want P-256 (or Ed25519)", k.Curve.Params().Name)
	}
	return fmt.Errorf("owner key: %T; want Ed25519 or ECDSA P-256", k)
}

// ParsePrivateKey reads an owner signing key: PEM PKCS #8 "PRIVATE KEY"
// (Ed25519 or ECDSA P-256) or SEC 1 "EC PRIVATE KEY" (P-256).
func ParsePrivateKey(data []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(data)
	if blk == nil {
		return nil, errors.New("signing key: not PEM")
	}
	var (
		k   any
		err error
	)
	switch blk.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(blk.Bytes)
	default:
		return nil, fmt.Errorf("signing key: a PEM %q block; want PRIVATE KEY (PKCS #8) or EC PRIVATE KEY", blk.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("signing key: %T cannot sign", k)
	}
	if err := checkKey(s.Public()); err != nil {
		return nil, err
	}
	return s, nil
}

// Sign checks the bundle JSON and signs it with key (Ed25519 or ECDSA
// P-256), returning a compact JWS.
func Sign(bundleJSON []byte, key crypto.Signer) (string, error) {
	if _, err := ParseBundle(bundleJSON); err != nil {
		return "", err
	}
	alg := jose.ES256
	var k any = key
	if ed, ok := key.(ed25519.PrivateKey); ok {
		alg, k = jose.EdDSA, ed
	}
	if err := checkKey(key.Public()); err != nil {
		return "", err
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: k}, (&jose.SignerOptions{}).WithType(BundleType))
	if err != nil {
		return "", fmt.Errorf("trust bundle: signer: %w", err)
	}
	jws, err := signer.Sign(bundleJSON)
	if err != nil {
		return "", fmt.Errorf("trust bundle: signing: %w", err)
	}
	return jws.CompactSerialize()
}

// Signed is a bundle whose signature verified.
type Signed struct {
	*Bundle
	// Digest is the SHA-256 of the signed payload: two bundles with one
	// serial and different digests are an equivocation.
	Digest [sha256.Size]byte
	// Key is the index of the owner key that verified it.
	Key int
}

// Verify checks a compact JWS against the owner's keys and decodes the
// bundle it signs. The error of a signature no key verifies says so.
func Verify(jws []byte, keys []crypto.PublicKey) (*Signed, error) {
	obj, err := jose.ParseSignedCompact(strings.TrimSpace(string(jws)), algorithms)
	if err != nil {
		return nil, fmt.Errorf("trust bundle: not a compact JWS signed with EdDSA or ES256: %w", err)
	}
	if len(obj.Signatures) != 1 {
		return nil, fmt.Errorf("trust bundle: %d signatures, want 1", len(obj.Signatures))
	}
	if typ, _ := obj.Signatures[0].Protected.ExtraHeaders[jose.HeaderType].(string); typ != BundleType {
		return nil, fmt.Errorf("trust bundle: JWS typ %q, want %q: a signature made for something else", typ, BundleType)
	}
	for i, k := range keys {
		payload, err := obj.Verify(k)
		if err != nil {
			continue
		}
		b, err := ParseBundle(payload)
		if err != nil {
			return nil, err
		}
		return &Signed{Bundle: b, Digest: sha256.Sum256(payload), Key: i}, nil
	}
	return nil, fmt.Errorf("trust bundle: the signature verifies with none of the %d owner key(s): forged, altered or signed with another key", len(keys))
}
