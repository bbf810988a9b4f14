package reattest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

func TestParseBundle(t *testing.T) {
	ok := `{"serial": 4, "on_failure": "stop", "min_tcb": "0x7308000000000003",
	  "reference": {"sim": {"measurements": {"1": "` + goodDigest.String() + `"}}, "tdx": {"mrtd": "` + otherDigest.String() + `"}},
	  "revoked": {"chip_ids": ["` + bytesOf(1, 64).String() + `"], "tcb_versions": [8288875114175397891, "0x7308000000000004"],
	    "init_data_digests": ["` + bytesOf(2, 32).String() + `", "` + bytesOf(3, 48).String() + `"], "measurements": ["` + otherDigest.String() + `"]}}`
	b, err := ParseBundle([]byte(ok))
	if err != nil {
		t.Fatal(err)
	}
	if b.Serial != 4 || b.OnFailure != OnFailureStop || b.MinTCB != 0x7308000000000003 || len(b.Revoked.TCBs) != 2 ||
		b.Revoked.TCBs[0] != 0x7308000000000003 || b.Revoked.TCBs[1] != 0x7308000000000004 ||
		b.Reference["sim"].Measurements[1].String() != goodDigest.String() || b.Reference["tdx"].MRTD.String() != otherDigest.String() {
		t.Errorf("parsed %+v", b)
	}
	// It writes itself back as it reads.
	out, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := ParseBundle(out); err != nil || again.Revoked.TCBs[1] != b.Revoked.TCBs[1] {
		t.Errorf("round trip %s: %v", out, err)
	}

	for _, c := range []struct{ doc, want string }{
		{`{"on_failure": "stop"}`, "no serial"},
		{`{"serial": 1, "on_failure": "kill"}`, "on_failure"},
		{`{"serial": 1, "revoked": {"tcbs": ["0x1"]}}`, "unknown field"},
		{`{"serial": 1, "revoked": {"chip_ids": ["` + bytesOf(1, 32).String() + `"]}}`, "chip_ids"},
		{`{"serial": 1, "revoked": {"init_data_digests": ["` + bytesOf(1, 40).String() + `"]}}`, "init_data_digests"},
		{`{"serial": 1, "revoked": {"tcb_versions": ["seven"]}}`, "TCB version"},
		{`{"serial": 1, "reference": {"sev": {"measurements": {"1": "` + goodDigest.String() + `"}}}}`, "unknown TEE"},
		{`{"serial": 1, "reference": {"snp": {"mrtd": "` + goodDigest.String() + `"}}}`, "reference.snp"},
		{`{"serial": 1, "reference": {"sim": {"measurements": {"1": "1122"}}}}`, "measurements[1]"},
		{`{"serial": 1, "issued": "2025-06-02T00:00:00Z", "expires": "2025-06-01T00:00:00Z"}`, "expires"},
		{`{"serial": 1} {"serial": 2}`, "after the JSON"},
	} {
		if _, err := ParseBundle([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.doc, err, c.want)
		}
	}
}

func TestSignAndVerify(t *testing.T) {
	doc := []byte(`{"serial": 9}`)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, key := range []crypto.Signer{ed, ec} {
		jws, err := Sign(doc, key)
		if err != nil {
			t.Fatal(err)
		}
		pub := pemPublic(t, key.Public())
		keys, err := ParsePublicKeys(append(pemPublic(t, otherKey(t)), pub...))
		if err != nil {
			t.Fatal(err)
		}
		s, err := Verify([]byte(jws+"\n"), keys)
		if err != nil || s.Serial != 9 || s.Key != 1 {
			t.Errorf("%T: verified %+v, %v", key, s, err)
		}
		if _, err := Verify([]byte(jws), keys[:1]); err == nil || !strings.Contains(err.Error(), "none of the 1 owner key") {
			t.Errorf("%T: verified with another key: %v", key, err)
		}
	}
	if _, err := Sign([]byte(`{"serial": 0}`), ed); err == nil {
		t.Error("signed an invalid bundle")
	}

	// A signature of the owner's key over something that is not a bundle
	// (another typ, or none) is no bundle.
	for _, opts := range []*jose.SignerOptions{{}, (&jose.SignerOptions{}).WithType("JWT")} {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: ed}, opts)
		if err != nil {
			t.Fatal(err)
		}
		obj, _ := signer.Sign(doc)
		jws, _ := obj.CompactSerialize()
		if _, err := Verify([]byte(jws), []crypto.PublicKey{ed.Public()}); err == nil || !strings.Contains(err.Error(), "typ") {
			t.Errorf("typ %v: %v", opts.ExtraHeaders, err)
		}
	}
	// Another algorithm is refused before any key is tried.
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	signer, _ := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: rk}, (&jose.SignerOptions{}).WithType(BundleType))
	obj, _ := signer.Sign(doc)
	jws, _ := obj.CompactSerialize()
	if _, err := Verify([]byte(jws), []crypto.PublicKey{ed.Public()}); err == nil || !strings.Contains(err.Error(), "EdDSA or ES256") {
		t.Errorf("RS256: %v", err)
	}
}

func TestKeys(t *testing.T) {
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	for _, k := range []crypto.PublicKey{rk.Public(), p384.Public()} {
		if _, err := ParsePublicKeys(pemPublic(t, k)); err == nil {
			t.Errorf("%T accepted as an owner key", k)
		}
	}
	if _, err := ParsePublicKeys([]byte("no pem")); err == nil {
		t.Error("no key accepted")
	}
	der, _ := x509.MarshalPKCS8PrivateKey(p384)
	if _, err := ParsePrivateKey(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err == nil {
		t.Error("P-384 signing key accepted")
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	sec1, _ := x509.MarshalECPrivateKey(ec)
	if k, err := ParsePrivateKey(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})); err != nil || !k.Public().(*ecdsa.PublicKey).Equal(ec.Public()) {
		t.Errorf("SEC 1 P-256 key: %v", err)
	}
	if _, err := NewStore(nil, FileSource("/x")); err == nil {
		t.Error("a store with sources and no key")
	}
}

func otherKey(t *testing.T) crypto.PublicKey {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func pemPublic(t *testing.T, k crypto.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}
