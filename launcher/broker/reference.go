package broker

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/manifest"
)

// Reference is one set of launch reference values: what a genuine pod of
// one image shows on one TEE. The owner supplies them (c8s-launcher kbs
// --reference-values FILE), from the image manifest the image builder
// ships (images/build.sh writes manifest.json with the digests c8s-measure
// computes); the node's own manifest is never read for them.
type Reference struct {
	// Source names where the values come from (a file), for messages.
	Source string
	// TEE is "snp", "sim" or "tdx".
	TEE string
	// Measurements are the SNP (and sim) launch digests by vCPU count.
	Measurements map[int]attest.Hex
	// MRTD and RTMRs are the TDX ones (an empty RTMR is not checked).
	MRTD  attest.Hex
	RTMRs []attest.Hex
}

// SignatureSuffix is appended to a reference file's name to find its
// detached signature.
const SignatureSuffix = ".sig"

// ReferenceFromManifest returns the reference values an image manifest
// (manifest.json, manifest.Parse) gives TEE tee: digests.sim or
// digests.snp by vCPU count; for tdx, MRTD with the predicted RTMR1 and
// RTMR2, which it must have.
func ReferenceFromManifest(data []byte, tee, source string) (Reference, error) {
	m, err := manifest.Parse(data)
	if err != nil {
		return Reference{}, fmt.Errorf("reference values %s: %w", source, err)
	}
	ref := Reference{Source: source, TEE: tee}
	switch tee {
	case "sim", "snp":
		if ref.Measurements, err = attest.ExpectedMeasurements(m, tee); err != nil {
			return Reference{}, fmt.Errorf("reference values %s: %w", source, err)
		}
	case "tdx":
		d, err := m.TDX()
		if err != nil {
			return Reference{}, fmt.Errorf("reference values %s: %w", source, err)
		}
		if ref.MRTD, err = attest.ParseHex(d.MRTD); err != nil {
			return Reference{}, fmt.Errorf("reference values %s: mrtd: %w", source, err)
		}
		ref.RTMRs = make([]attest.Hex, 4)
		for i, r := range map[int]string{1: d.RTMR1, 2: d.RTMR2} {
			// RTMR1 and RTMR2 hold the kernel, its command line and the
			// initrd: without them MRTD alone would admit any of these.
			if r == "" {
				return Reference{}, fmt.Errorf("reference values %s: the manifest predicts no rtmr%d (digests.tdx.rtmr1, rtmr2): a TD's kernel, command line and initrd cannot be checked without it; rebuild the image with a current mkmanifest", source, i)
			}
			if ref.RTMRs[i], err = attest.ParseHex(r); err != nil || len(ref.RTMRs[i]) != digestSize {
				return Reference{}, fmt.Errorf("reference values %s: rtmr%d %q is not a SHA-384 hex digest", source, i, r)
			}
		}
	default:
		return Reference{}, fmt.Errorf("reference values %s: TEE %q: want snp, tdx or sim", source, tee)
	}
	return ref, nil
}

// LoadReferenceValues reads the reference values for tee from an image
// manifest the owner holds. With key non-nil, path+SignatureSuffix must
// hold a signature by key over the file's exact bytes (VerifySignature);
// without one, or with a wrong one, nothing is read.
func LoadReferenceValues(path, tee string, key crypto.PublicKey) (Reference, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Reference{}, fmt.Errorf("reference values: %w", err)
	}
	if key != nil {
		sig, err := os.ReadFile(path + SignatureSuffix)
		if err != nil {
			return Reference{}, fmt.Errorf("reference values %s: its signature: %w (sign the file with the owner's key, see --reference-key)", path, err)
		}
		if err := VerifySignature(key, data, sig); err != nil {
			return Reference{}, fmt.Errorf("reference values %s: %w", path, err)
		}
	}
	return ReferenceFromManifest(data, tee, path)
}

// ParsePublicKey reads an owner's public key: PEM "PUBLIC KEY" (PKIX),
// Ed25519 or ECDSA P-256 / P-384, as `openssl pkey -pubout` writes it.
func ParsePublicKey(pemBytes []byte) (crypto.PublicKey, error) {
	blk, _ := pem.Decode(pemBytes)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, errors.New("reference key: want a PEM PUBLIC KEY (openssl pkey -in key.pem -pubout)")
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("reference key: %w", err)
	}
	switch k := k.(type) {
	case ed25519.PublicKey:
		return k, nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("reference key: ECDSA on %s: want P-256 or P-384", k.Curve.Params().Name)
		}
		return k, nil
	}
	return nil, fmt.Errorf("reference key: %T keys are not accepted: want Ed25519 or ECDSA P-256 / P-384", k)
}

// VerifySignature checks a detached signature over data: Ed25519 (64
// bytes, as `openssl pkeyutl -sign -rawin` writes it), or ECDSA ASN.1 DER
// over the SHA-256 (P-256) or SHA-384 (P-384) of data (`openssl dgst
// -sha256 -sign` / `-sha384 -sign`). The signature file may also hold
// the same bytes in base64.
func VerifySignature(key crypto.PublicKey, data, sig []byte) error {
	if b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(sig))); err == nil && len(b) > 0 {
		sig = b
	}
	switch k := key.(type) {
	case ed25519.PublicKey:
		if len(sig) == ed25519.SignatureSize && ed25519.Verify(k, data, sig) {
			return nil
		}
	case *ecdsa.PublicKey:
		var digest []byte
		if k.Curve == elliptic.P384() {
			d := sha512.Sum384(data)
			digest = d[:]
		} else {
			d := sha256.Sum256(data)
			digest = d[:]
		}
		if ecdsa.VerifyASN1(k, digest, sig) {
			return nil
		}
	default:
		return fmt.Errorf("signature: %T keys are not accepted", key)
	}
	return errors.New("the signature does not verify under the owner's reference key: the file was changed after it was signed, or signed with another key")
}
