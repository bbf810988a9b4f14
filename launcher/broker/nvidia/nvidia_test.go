package nvidia

import (
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func readHex(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	out, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

const (
	sampleNonce = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"
	// cocoRuntimeDataHash is the sha384 of the KBS runtime data in the
	// CoCo CI run; the GPU nonce is its first 32 bytes.
	cocoRuntimeDataHash = "87d8e24ab336adafe228d49e83d745f6dba4ae505372b6a5704820856b343fece279b616efefc2aae21da80cf5581250"
)

// TestVerifyHopperSample verifies a genuine Hopper report and compares
// the claims with those NVIDIA's own verifier derived from it.
func TestVerifyHopperSample(t *testing.T) {
	c, err := VerifyHopper(readHex(t, "hopperAttestationReport.txt"), readFile(t, "hopper_cert_chain_case1.txt"), Options{Nonce: mustHex(sampleNonce)})
	if err != nil {
		t.Fatal(err)
	}
	var want struct {
		Config struct {
			DriverVersion string `json:"driver_version"`
			VBIOSVersion  string `json:"vbios_version"`
			FWID          string `json:"fwid"`
		} `json:"config"`
		Measurements map[string]string `json:"measurements"`
	}
	if err := json.Unmarshal(readFile(t, "hopperAttestationReport-claims.txt"), &want); err != nil {
		t.Fatal(err)
	}
	if c.DriverVersion != want.Config.DriverVersion || c.VBIOSVersion != want.Config.VBIOSVersion || c.FWID != want.Config.FWID {
		t.Fatalf("claims driver %q vbios %q fwid %s, want %q %q %s", c.DriverVersion, c.VBIOSVersion, c.FWID, want.Config.DriverVersion, want.Config.VBIOSVersion, want.Config.FWID)
	}
	if len(c.Measurements) != len(want.Measurements) || len(c.Measurements) != 64 {
		t.Fatalf("%d measurements, want %d", len(c.Measurements), len(want.Measurements))
	}
	for k, v := range want.Measurements {
		i, _ := strconv.Atoi(k)
		if c.Measurements[i] != v {
			t.Errorf("measurement %d = %s, want %s", i, c.Measurements[i], v)
		}
	}
	if c.DriverVersion != "550.90.07" || c.VBIOSVersion != "96.00.9f.00.01" {
		t.Fatalf("%+v", c)
	}
}

// TestVerifyHopperCoCo: a report from a Confidential Containers CI run,
// whose nonce is the KBS runtime data hash cut to 32 bytes.
func TestVerifyHopperCoCo(t *testing.T) {
	nonce := mustHex(cocoRuntimeDataHash)[:NonceSize]
	if _, err := VerifyHopper(readHex(t, "hopper_coco_report1.txt"), readFile(t, "hopper_coco_certs1.txt"), Options{Nonce: nonce}); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyHopperRefuses(t *testing.T) {
	report, chain := readHex(t, "hopperAttestationReport.txt"), readFile(t, "hopper_cert_chain_case1.txt")
	nonce := mustHex(sampleNonce)
	flip := func(b []byte, i int) []byte {
		c := append([]byte(nil), b...)
		c[i] ^= 1
		return c
	}
	other := readFile(t, "hopper_coco_certs1.txt")
	for _, c := range []struct {
		name          string
		report, chain []byte
		nonce         []byte
		want          string
	}{
		{"other nonce", report, chain, mustHex(cocoRuntimeDataHash)[:32], "not the session's"},
		{"measurement changed", flip(report, 200), chain, nonce, "signature does not verify"},
		{"nonce in the request changed", flip(report, 10), chain, nonce, "signature does not verify"},
		{"signature changed", flip(report, len(report)-5), chain, nonce, "signature does not verify"},
		{"another GPU's chain", report, other, nonce, "FWID"},
		{"root only", report, readFile(t, "hopper_cert_chain_case2.txt"), nonce, "has 1 certificates"},
		{"intermediate missing", report, readFile(t, "hopper_cert_chain_case3.txt"), nonce, "does not lead to NVIDIA's device identity root"},
		{"leaf missing", report, readFile(t, "hopper_cert_chain_case4.txt"), nonce, "no FWID extension"},
		{"truncated", report[:len(report)-1], chain, nonce, "runs past the end"},
		{"trailing byte", append(append([]byte(nil), report...), 0, 1), chain, nonce, "after the signature that are not zero padding"},
		{"short nonce", report, chain, nonce[:16], "expected nonce is 16 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := VerifyHopper(c.report, c.chain, Options{Nonce: c.nonce})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

// TestForeignRootRefused: a chain is only as good as the pinned root; a
// pool without NVIDIA's root refuses the genuine chain.
func TestForeignRootRefused(t *testing.T) {
	pool := x509NewPoolWithout()
	_, err := VerifyHopper(readHex(t, "hopperAttestationReport.txt"), readFile(t, "hopper_cert_chain_case1.txt"), Options{Nonce: mustHex(sampleNonce), Roots: pool})
	if err == nil || !strings.Contains(err.Error(), "does not lead to NVIDIA's device identity root") {
		t.Fatalf("error %v", err)
	}
}

func x509NewPoolWithout() *x509.CertPool { return x509.NewCertPool() }
