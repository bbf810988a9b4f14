package broker

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	guestkbs "github.com/c8s-dev/c8s/guest/kbs"
	"github.com/c8s-dev/c8s/manifest"
)

// manifestJSON is an image manifest, as images/build.sh writes it, whose
// sim digest for one vCPU is measurement.
func manifestJSON(t *testing.T, measurement []byte) []byte {
	t.Helper()
	sum := strings.Repeat("ab", 32)
	m := &manifest.Manifest{Schema: manifest.Schema, Artifacts: map[string]manifest.Artifact{
		manifest.RoleKernel: {File: "vmlinuz", Size: 1, SHA256: sum},
		manifest.RoleInitrd: {File: "initrd.img", Size: 1, SHA256: sum},
	}}
	if err := m.SetSim(manifest.SimDigests{Cmdline: "console=ttyS0 c8s.tee=sim", ByVCPUs: map[string]string{"1": hex.EncodeToString(measurement)}}); err != nil {
		t.Fatal(err)
	}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The broker's launch reference values come from the owner's manifests:
// the pod's measurement must be in one of them, whatever the Policy's own
// measurements say.
func TestReferenceValues(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	other := make([]byte, 48)
	if _, err := rand.Read(other); err != nil {
		t.Fatal(err)
	}
	load := func(name string, m []byte) Reference {
		ref, err := LoadReferenceValues(writeFile(t, dir, name, manifestJSON(t, m)), "sim", nil)
		if err != nil {
			t.Fatal(err)
		}
		return ref
	}
	good, wrong, wrong2 := load("app-v2.json", f.measurement[:]), load("app-v1.json", other), load("app-v0.json", other)
	if got := good.Measurements[1]; string(got) != string(f.measurement[:]) {
		t.Fatalf("reference measurement %x, want the manifest's", got)
	}
	fetch := func() error { _, err := f.client().Fetch(context.Background(), []string{dbPassword}); return err }

	// The policy's own measurement is the pod's; the owner's reference
	// values are not, and they decide.
	f.broker.References = []Reference{wrong}
	if err := fetch(); err == nil || !strings.Contains(err.Error(), "measurement mismatch") {
		t.Fatalf("a pod outside the owner's reference values: err = %v", err)
	}
	f.broker.References = []Reference{wrong, wrong2}
	var e *guestkbs.Error
	if err := fetch(); !errors.As(err, &e) || e.Status != http.StatusUnauthorized ||
		!strings.Contains(err.Error(), "none of the owner's reference values") || !strings.Contains(err.Error(), "app-v1.json: measurement mismatch") || !strings.Contains(err.Error(), "app-v0.json") {
		t.Fatalf("two reference sets, neither the pod's: err = %v", err)
	}
	f.broker.References = []Reference{wrong, good}
	if err := fetch(); err != nil {
		t.Fatalf("the pod's image among the owner's reference values: %v", err)
	}
	if !strings.Contains(f.logs.String(), "reference="+filepath.Join(dir, "app-v2.json")) {
		t.Fatalf("the log does not name the matched reference values:\n%s", f.logs.String())
	}
	// Reference values for another TEE only: refused, naming the flag.
	tdx := good
	tdx.TEE = "tdx"
	f.broker.References = []Reference{tdx}
	if err := fetch(); err == nil || !strings.Contains(err.Error(), "none for TEE sim") || !strings.Contains(err.Error(), "--reference-values") {
		t.Fatalf("no reference values for the TEE: err = %v", err)
	}
}

// signer signs like the owner would: Ed25519 over the bytes, ECDSA over
// their SHA-256 (P-256) or SHA-384 (P-384), ASN.1.
type signer struct {
	name string
	key  crypto.Signer
}

func (s signer) sign(t *testing.T, data []byte) []byte {
	t.Helper()
	var sig []byte
	var err error
	switch k := s.key.(type) {
	case ed25519.PrivateKey:
		sig = ed25519.Sign(k, data)
	case *ecdsa.PrivateKey:
		var d []byte
		if k.Curve == elliptic.P384() {
			h := sha512.Sum384(data)
			d = h[:]
		} else {
			h := sha256.Sum256(data)
			d = h[:]
		}
		sig, err = ecdsa.SignASN1(rand.Reader, k, d)
	}
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

func (s signer) publicPEM(t *testing.T) []byte {
	der, err := x509.MarshalPKIXPublicKey(s.key.Public())
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func signers(t *testing.T) []signer {
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p256, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return []signer{{"ed25519", ed}, {"ecdsa-p256", p256}, {"ecdsa-p384", p384}}
}

// A signed reference file is read only with a valid signature by the
// owner's key over its exact bytes.
func TestReferenceValuesSigned(t *testing.T) {
	all := signers(t)
	for i, s := range all {
		t.Run(s.name, func(t *testing.T) {
			dir := t.TempDir()
			data := manifestJSON(t, make([]byte, 48))
			path := writeFile(t, dir, "manifest.json", data)
			key, err := ParsePublicKey(s.publicPEM(t))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := LoadReferenceValues(path, "sim", key); err == nil || !strings.Contains(err.Error(), "its signature") {
				t.Fatalf("no signature file: err = %v", err)
			}
			sig := s.sign(t, data)
			writeFile(t, dir, "manifest.json.sig", sig)
			if _, err := LoadReferenceValues(path, "sim", key); err != nil {
				t.Fatalf("signed: %v", err)
			}
			writeFile(t, dir, "manifest.json.sig", []byte(base64.StdEncoding.EncodeToString(sig)+"\n"))
			if _, err := LoadReferenceValues(path, "sim", key); err != nil {
				t.Fatalf("signed, base64: %v", err)
			}
			// One digit of the reference values changed after signing.
			tampered := []byte(strings.Replace(string(data), `"1": "00`, `"1": "01`, 1))
			if string(tampered) == string(data) {
				t.Fatal("the manifest was not changed")
			}
			writeFile(t, dir, "manifest.json", tampered)
			if _, err := LoadReferenceValues(path, "sim", key); err == nil || !strings.Contains(err.Error(), "does not verify") {
				t.Fatalf("changed after signing: err = %v", err)
			}
			// Signed by another key.
			writeFile(t, dir, "manifest.json", data)
			writeFile(t, dir, "manifest.json.sig", all[(i+1)%len(all)].sign(t, data))
			if _, err := LoadReferenceValues(path, "sim", key); err == nil || !strings.Contains(err.Error(), "does not verify") {
				t.Fatalf("signed by another key: err = %v", err)
			}
		})
	}
}

// Signatures made with openssl, as an owner would make them, verify; and
// a key of a kind the broker does not take is refused.
func TestReferenceValuesSignedWithOpenSSL(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl is not installed: run make deps")
	}
	dir := t.TempDir()
	data := manifestJSON(t, make([]byte, 48))
	path := writeFile(t, dir, "manifest.json", data)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, tc := range []struct {
		name string
		gen  []string
		sign []string
	}{
		{"ed25519", []string{"genpkey", "-algorithm", "ed25519"}, []string{"pkeyutl", "-sign", "-rawin", "-in", path}},
		{"ecdsa-p256", []string{"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"}, []string{"dgst", "-sha256", "-sign"}},
		{"ecdsa-p384", []string{"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"}, []string{"dgst", "-sha384", "-sign"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			priv, pub := filepath.Join(dir, tc.name+".key"), filepath.Join(dir, tc.name+".pub")
			run(append(tc.gen, "-out", priv)...)
			run("pkey", "-in", priv, "-pubout", "-out", pub)
			sign := append([]string{}, tc.sign...)
			if tc.sign[0] == "pkeyutl" {
				sign = append(sign, "-inkey", priv, "-out", path+SignatureSuffix)
			} else {
				sign = append(sign, priv, "-out", path+SignatureSuffix, path)
			}
			run(sign...)
			pubPEM, err := os.ReadFile(pub)
			if err != nil {
				t.Fatal(err)
			}
			key, err := ParsePublicKey(pubPEM)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := LoadReferenceValues(path, "sim", key); err != nil {
				t.Fatalf("openssl's signature: %v", err)
			}
		})
	}
	run("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", filepath.Join(dir, "rsa.key"))
	run("pkey", "-in", filepath.Join(dir, "rsa.key"), "-pubout", "-out", filepath.Join(dir, "rsa.pub"))
	rsaPub, _ := os.ReadFile(filepath.Join(dir, "rsa.pub"))
	if _, err := ParsePublicKey(rsaPub); err == nil || !strings.Contains(err.Error(), "Ed25519 or ECDSA") {
		t.Fatalf("an RSA key: err = %v", err)
	}
}

func TestReferenceFromManifestTDX(t *testing.T) {
	m := &manifest.Manifest{}
	if err := json.Unmarshal(manifestJSON(t, make([]byte, 48)), m); err != nil {
		t.Fatal(err)
	}
	mrtd, r1, r2 := strings.Repeat("11", 48), strings.Repeat("22", 48), strings.Repeat("33", 48)
	if err := m.SetTDX(manifest.TDXDigests{MRTD: mrtd, RTMR1: r1, RTMR2: r2}); err != nil {
		t.Fatal(err)
	}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := ReferenceFromManifest(b, "tdx", "m.json")
	if err != nil {
		t.Fatal(err)
	}
	if ref.MRTD.String() != mrtd || len(ref.RTMRs) != 4 || len(ref.RTMRs[0]) != 0 || ref.RTMRs[1].String() != r1 || ref.RTMRs[2].String() != r2 || len(ref.RTMRs[3]) != 0 {
		t.Fatalf("TDX reference values %+v", ref)
	}
	if _, err := ReferenceFromManifest(b, "snp", "m.json"); err == nil || !strings.Contains(err.Error(), "m.json") {
		t.Fatalf("a manifest without snp digests: err = %v", err)
	}
	if _, err := ReferenceFromManifest([]byte(`{"schema": "x"}`), "sim", "m.json"); err == nil {
		t.Fatal("a malformed manifest was read")
	}
	// Without RTMR1 or RTMR2, MRTD alone would admit any kernel, command
	// line and initrd: refused.
	for _, d := range []manifest.TDXDigests{{MRTD: mrtd, RTMR2: r2}, {MRTD: mrtd, RTMR1: r1}} {
		if err := m.SetTDX(d); err != nil {
			t.Fatal(err)
		}
		b, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if ref, err := ReferenceFromManifest(b, "tdx", "m.json"); err == nil || !strings.Contains(err.Error(), "predicts no rtmr") {
			t.Errorf("a TDX manifest without rtmr1 or rtmr2 (%+v): %+v, err = %v", d, ref, err)
		}
	}
}
