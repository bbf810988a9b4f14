package kbs

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"testing"

	josecipher "github.com/go-jose/go-jose/v4/cipher"
)

// concatKDF is NIST SP 800-56A's Concat KDF with SHA-256 as RFC 7518
// 4.6.2 uses it for ECDH-ES: empty PartyUInfo and PartyVInfo.
func concatKDF(z []byte, alg string, bits uint32) []byte {
	h := sha256.New()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], 1)
	h.Write(n[:])
	h.Write(z)
	binary.BigEndian.PutUint32(n[:], uint32(len(alg)))
	h.Write(n[:])
	h.Write([]byte(alg))
	h.Write([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	binary.BigEndian.PutUint32(n[:], bits)
	h.Write(n[:])
	return h.Sum(nil)[:bits/8]
}

// trusteeResponse encrypts plain to pub the way Trustee's KBS builds a
// resource response for a P-256 tee-pubkey (trustee kbs/src/jwe/mod.rs,
// ecdh_es_a256kw_p256): an ephemeral P-256 key, the Concat KDF over the
// shared secret, the CEK wrapped with A256KW, A256GCM with the base64url
// protected header as AAD, and no "aad" member.
func trusteeResponse(t *testing.T, pub *ecdsa.PublicKey, plain []byte) []byte {
	t.Helper()
	b64 := base64.RawURLEncoding
	peer, err := pub.ECDH()
	if err != nil {
		t.Fatal(err)
	}
	eph, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	z, err := eph.ECDH(peer)
	if err != nil {
		t.Fatal(err)
	}
	kek, err := aes.NewCipher(concatKDF(z, "ECDH-ES+A256KW", 256))
	if err != nil {
		t.Fatal(err)
	}
	cek := make([]byte, 32)
	_, _ = rand.Read(cek)
	wrapped, err := josecipher.KeyWrap(kek, cek)
	if err != nil {
		t.Fatal(err)
	}
	point := eph.PublicKey().Bytes() // 0x04 || X || Y
	// serde_json of kbs-types' ProtectedHeader: alg, enc, then the
	// flattened other fields (epk, its keys sorted).
	protected := `{"alg":"ECDH-ES+A256KW","enc":"A256GCM","epk":{"crv":"P-256","kty":"EC","x":"` +
		b64.EncodeToString(point[1:33]) + `","y":"` + b64.EncodeToString(point[33:]) + `"}}`
	protectedB64 := b64.EncodeToString([]byte(protected))
	block, _ := aes.NewCipher(cek)
	gcm, _ := cipher.NewGCM(block)
	iv := make([]byte, 12)
	_, _ = rand.Read(iv)
	sealed := gcm.Seal(nil, iv, plain, []byte(protectedB64))
	ct, tag := sealed[:len(plain)], sealed[len(plain):]
	resp, _ := json.Marshal(map[string]string{
		"protected":     protectedB64,
		"encrypted_key": b64.EncodeToString(wrapped),
		"iv":            b64.EncodeToString(iv),
		"ciphertext":    b64.EncodeToString(ct),
		"tag":           b64.EncodeToString(tag),
	})
	return resp
}

func TestOpenTrusteeResponse(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	resp := trusteeResponse(t, &key.PublicKey, []byte("s3cr3t"))
	got, err := openResponse(resp, key)
	if err != nil || string(got) != "s3cr3t" {
		t.Fatalf("openResponse = %q, %v", got, err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if _, err := openResponse(resp, other); err == nil {
		t.Fatal("another session's key opened the response")
	}
	var m map[string]string
	_ = json.Unmarshal(resp, &m)
	m["tag"] = base64.RawURLEncoding.EncodeToString(make([]byte, 16))
	tampered, _ := json.Marshal(m)
	if _, err := openResponse(tampered, key); err == nil {
		t.Fatal("a response with a wrong tag was opened")
	}
}
