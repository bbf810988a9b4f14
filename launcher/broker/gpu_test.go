package broker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/launcher/broker/nvidia"
)

// fakeGPUs stands in for the GPUs' verification in the broker-level tests:
// genuine reports carry the nonce of the session they were made for, which
// is not this test's (the genuine reports are verified by
// TestLocalGPUVerifier and launcher/broker/nvidia).
type fakeGPUs struct {
	nonces [][]byte
	claims GPUClaims
	err    error
}

func (f *fakeGPUs) VerifyGPU(ev GPUEvidence, nonce []byte) (*GPUClaims, error) {
	f.nonces = append(f.nonces, nonce)
	if f.err != nil {
		return nil, f.err
	}
	c := f.claims
	c.UUID = ev.UUID
	c.Leaf = "CN=GPU " + ev.UUID
	return &c, nil
}

// attestationWith answers ch with additional evidence the CPU evidence
// binds, as the guest's attester builds it.
func (s *rawSession) attestationWith(ch kbsapi.Challenge, additional string) kbsapi.Attestation {
	s.t.Helper()
	rt := kbsapi.RuntimeData{Nonce: ch.Nonce, TeePubKey: json.RawMessage(`{"kty":"EC","crv":"P-256","alg":"ECDH-ES+A256KW","x":"weNJy2HscCSM6AEDTDg04biOvhFhyyWvOHQfeF_PxMQ","y":"e8lnCO-AlStT-NJVX-crhB7QRYhiix03illJOVAOyck"}`)}
	bound, err := kbsapi.PrimaryRuntimeData(rt, additional)
	if err != nil {
		s.t.Fatal(err)
	}
	rd, err := kbsapi.ReportData(bound, kbsapi.DefaultHashAlgorithm)
	if err != nil {
		s.t.Fatal(err)
	}
	_, ev, err := s.f.snpEvidence(context.Background(), rd)
	if err != nil {
		s.t.Fatal(err)
	}
	return kbsapi.Attestation{RuntimeData: rt, TeeEvidence: kbsapi.CompositeEvidence{PrimaryEvidence: ev, AdditionalEvidence: additional},
		InitData: &kbsapi.InitData{Format: "toml", Body: string(s.f.initData)}}
}

// nvidiaEvidence is additional evidence with the given devices.
func nvidiaEvidence(t *testing.T, devs ...GPUEvidence) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{TeeNVIDIA: map[string]any{"device_evidence_list": devs}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fetch attests with additional evidence and fetches db-password: the
// attestation's status, then the resource's (0 when not attested).
func (f *fixture) fetchWithGPUs(t *testing.T, additional string) (attest int, attestBody string, resource int, resourceBody string) {
	t.Helper()
	s := f.rawSession(t)
	st, body := s.post(kbsapi.AttestPath, s.attestationWith(s.auth(), additional))
	if st != http.StatusOK {
		return st, string(body), 0, ""
	}
	resp, err := s.http.Get(f.srv.URL + kbsapi.ResourcePath + dbPassword)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	return st, string(body), resp.StatusCode, string(rb)
}

const gpuPolicy = appPolicy + `
[workloads.app.gpu]
count = 1
driver_versions = ["550.90.07"]
measurements = { 2 = "8048dfd18fe229bf16eb9d30cca0f11a24dafe6eb731de1462984645a0b189b77c4e4e17de727a5e19e3d07de51da338" }
`

// TestGPUEvidenceComposite: GPU evidence travels as the composite
// evidence's additional evidence, bound by the CPU evidence; the verifier
// gets the session's GPU nonce; a workload whose policy requires GPUs gets
// its resource only with verified GPUs that match.
func TestGPUEvidenceComposite(t *testing.T) {
	f := newFixture(t)
	gpus := &fakeGPUs{claims: GPUClaims{Claims: nvidia.Claims{Arch: "hopper", DriverVersion: "550.90.07", VBIOSVersion: "96.00.9f.00.01",
		Measurements: map[int]string{2: "8048dfd18fe229bf16eb9d30cca0f11a24dafe6eb731de1462984645a0b189b77c4e4e17de727a5e19e3d07de51da338"}}}}
	f.broker.GPUVerifier = gpus
	f.setPolicy(t, gpuPolicy)
	one := nvidiaEvidence(t, GPUEvidence{Arch: "HOPPER", UUID: "GPU-1", Evidence: "00", Certificate: "AA=="})

	// Without GPU evidence the workload's GPU requirement refuses.
	if st, _, rst, rb := f.fetchWithGPUs(t, ""); st != http.StatusOK || rst != http.StatusForbidden || !strings.Contains(rb, "GPU evidence: 0 verified GPUs, the workload requires 1") {
		t.Fatalf("no GPU evidence: attest %d, resource %d %s", st, rst, rb)
	}
	// With it: released, and the verifier was asked with the session's
	// GPU nonce (sha384 of {nonce, tee-pubkey}, first 32 bytes).
	st, body, rst, rb := f.fetchWithGPUs(t, one)
	if st != http.StatusOK || rst != http.StatusOK {
		t.Fatalf("with GPU evidence: attest %d %s, resource %d %s", st, body, rst, rb)
	}
	if n := gpus.nonces[len(gpus.nonces)-1]; len(n) != nvidia.NonceSize {
		t.Fatalf("GPU nonce %x", n)
	}

	// Two reports of the same GPU count once.
	if st, body, _, _ := f.fetchWithGPUs(t, nvidiaEvidence(t, GPUEvidence{Arch: "HOPPER", UUID: "GPU-1"}, GPUEvidence{Arch: "HOPPER", UUID: "GPU-1"})); st != http.StatusUnauthorized || !strings.Contains(body, "the same GPU") {
		t.Fatalf("one GPU twice: %d %s", st, body)
	}
	// A GPU whose report does not verify refuses the attestation.
	gpus.err = errors.New("the report's signature does not verify")
	if st, body, _, _ := f.fetchWithGPUs(t, one); st != http.StatusUnauthorized || !strings.Contains(body, "signature does not verify") {
		t.Fatalf("bad GPU report: %d %s", st, body)
	}
	gpus.err = nil
	// Another driver, another measurement: refused by the policy.
	gpus.claims.DriverVersion = "535.104.05"
	if _, _, rst, rb := f.fetchWithGPUs(t, one); rst != http.StatusForbidden || !strings.Contains(rb, "driver version 535.104.05 is not one of the workload's driver_versions") {
		t.Fatalf("other driver: %d %s", rst, rb)
	}
	gpus.claims.DriverVersion = "550.90.07"
	gpus.claims.Measurements = map[int]string{2: "00"}
	if _, _, rst, rb := f.fetchWithGPUs(t, one); rst != http.StatusForbidden || !strings.Contains(rb, "measurement 2 is") || !strings.Contains(rb, "not the workload's 8048dfd1") {
		t.Fatalf("other measurement: %d %s", rst, rb)
	}
	// Device evidence of a kind the broker cannot verify, bound by the
	// CPU evidence, is refused by name.
	if st, body, _, _ := f.fetchWithGPUs(t, `{"sampledevice":{}}`); st != http.StatusUnauthorized || !strings.Contains(body, `sampledevice\" devices are not verified by this broker`) {
		t.Fatalf("unknown device: %d %s", st, body)
	}
	// Swapping the GPU evidence of a verified pod: the CPU evidence binds
	// the string, so the swap breaks REPORT_DATA.
	s := f.rawSession(t)
	att := s.attestationWith(s.auth(), one)
	att.TeeEvidence.AdditionalEvidence = nvidiaEvidence(t, GPUEvidence{Arch: "HOPPER", UUID: "GPU-2"})
	if st, body := s.post(kbsapi.AttestPath, att); st != http.StatusUnauthorized || !strings.Contains(string(body), "REPORT_DATA") {
		t.Fatalf("swapped GPU evidence: %d %s", st, body)
	}
}

// TestGPUNonce: the GPU nonce binds the session's nonce and key, not the
// additional evidence (Trustee's KBS hashes {nonce, tee-pubkey} for it).
func TestGPUNonce(t *testing.T) {
	rt := kbsapi.RuntimeData{Nonce: "abc", TeePubKey: json.RawMessage(`{"kty":"EC","y":"2","x":"1"}`)}
	got, err := gpuNonce(rt, "sha384")
	if err != nil {
		t.Fatal(err)
	}
	rd, err := kbsapi.ReportData([]byte(`{"nonce":"abc","tee-pubkey":{"kty":"EC","x":"1","y":"2"}}`), "sha384")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(rd[:32]) {
		t.Fatalf("GPU nonce %x, want %x", got, rd[:32])
	}
	rt.Nonce = "abd"
	if other, _ := gpuNonce(rt, "sha384"); string(other) == string(got) {
		t.Fatal("the GPU nonce does not depend on the session nonce")
	}
}

// TestLocalGPUVerifier runs the broker's default verifier on a genuine
// public Hopper report in the device_evidence_list encoding (hex and
// base64 evidence), and refuses it for another session's nonce and for an
// architecture it does not verify.
func TestLocalGPUVerifier(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("nvidia", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	reportHex, chain := read("hopperAttestationReport.txt"), read("hopper_cert_chain_case1.txt")
	nonce := mustDecodeHex(t, "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb")
	ev := GPUEvidence{Arch: "HOPPER", UUID: "GPU-sample", Evidence: reportHex, Certificate: base64.StdEncoding.EncodeToString([]byte(chain))}
	c, err := LocalGPUVerifier{}.VerifyGPU(ev, nonce)
	if err != nil {
		t.Fatal(err)
	}
	if c.UUID != "GPU-sample" || c.DriverVersion != "550.90.07" || len(c.Measurements) != 64 {
		t.Fatalf("%+v", c)
	}
	ev.Evidence = base64.StdEncoding.EncodeToString(mustDecodeHex(t, reportHex))
	if _, err := (LocalGPUVerifier{}).VerifyGPU(ev, nonce); err != nil {
		t.Fatalf("base64 evidence: %v", err)
	}
	nonce[0] ^= 1
	if _, err := (LocalGPUVerifier{}).VerifyGPU(ev, nonce); err == nil || !strings.Contains(err.Error(), "not the session's") {
		t.Fatalf("another nonce: %v", err)
	}
	ev.Arch = "BLACKWELL"
	if _, err := (LocalGPUVerifier{}).VerifyGPU(ev, nonce); err == nil || !strings.Contains(err.Error(), "Hopper only") {
		t.Fatalf("blackwell: %v", err)
	}
}

func TestGPURequirementValidated(t *testing.T) {
	f := newFixture(t)
	for policy, want := range map[string]string{
		appPolicy + "\n[workloads.app.gpu]\ncount = 17\n":                    "gpu.count 17",
		appPolicy + "\n[workloads.app.gpu]\nmeasurements = { x = \"00\" }\n": `gpu.measurements key "x"`,
		appPolicy + "\n[workloads.app.gpu]\ncuont = 1\n":                     "unknown key",
	} {
		_, err := ParseResourcePolicy([]byte(f.expand(policy)), false, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("policy error %v, want %q", err, want)
		}
	}
}

func mustDecodeHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := decodeReport(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
