package kbs

import (
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

// Trustee's attestation service hashes structured runtime data in its
// canonical JSON form; its unit test (trustee attestation-service/src/
// lib.rs, parse_runtime_data cases) publishes this sha384 for
// {"b": 1, "a": "test", "c": {"d": "e"}}.
func TestReportDataPublishedVector(t *testing.T) {
	rd, err := ReportData([]byte(`{"b": 1, "a": "test", "c": {"d": "e"}}`), "sha384")
	if err != nil {
		t.Fatal(err)
	}
	const want = "e71ce8e70d814ba6639c3612ebee0ff1f76f650f8dbb5e47157e0f3f525cd22c4597480a186427c813ca941da78870c3"
	if got := hex.EncodeToString(rd[:48]); got != want {
		t.Fatalf("sha384 = %s, want %s", got, want)
	}
	if [16]byte(rd[48:]) != ([16]byte{}) {
		t.Fatal("REPORT_DATA is not zero after the digest")
	}
}

// The primary evidence binds {additional-evidence, nonce, tee-pubkey}, in
// canonical form: keys sorted at every level, no white space.
func TestPrimaryRuntimeData(t *testing.T) {
	rt := RuntimeData{Nonce: "bm9uY2U=", TeePubKey: json.RawMessage(`{"kty":"EC", "y":"Y", "x":"X", "crv":"P-256", "alg":"ECDH-ES+A256KW"}`)}
	doc, err := PrimaryRuntimeData(rt, "")
	if err != nil {
		t.Fatal(err)
	}
	canon, err := Canonical(doc)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"additional-evidence":"","nonce":"bm9uY2U=","tee-pubkey":{"alg":"ECDH-ES+A256KW","crv":"P-256","kty":"EC","x":"X","y":"Y"}}`
	if string(canon) != want {
		t.Fatalf("canonical runtime data\n%s\nwant\n%s", canon, want)
	}
	rd, err := ReportData(doc, "sha384")
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha512.Sum384([]byte(want)); string(rd[:48]) != string(sum[:]) {
		t.Fatal("REPORT_DATA is not the sha384 of the canonical document")
	}
	if _, err := PrimaryRuntimeData(RuntimeData{Nonce: "n", TeePubKey: json.RawMessage(`{`)}, ""); err == nil {
		t.Fatal("a tee-pubkey that is not JSON was accepted")
	}
}

func TestChallengeSelectedHash(t *testing.T) {
	for _, c := range []struct{ params, want, err string }{
		{`""`, "sha384", ""}, // Trustee's KBS with its built-in attestation service
		{`{}`, "sha384", ""},
		{`null`, "sha384", ""},
		{``, "sha384", ""},
		{`{"selected-hash-algorithm":"SHA512"}`, "sha512", ""},
		{`{"selected-hash-algorithm":"sha256"}`, "sha256", ""},
		{`{"selected-hash-algorithm":"sm3"}`, "", "not supported"},
		{`{"selected-hash-algorithm":3}`, "", "not a string"},
	} {
		var ch Challenge
		body := `{"nonce":"n"}`
		if c.params != "" {
			body = `{"nonce":"n","extra-params":` + c.params + `}`
		}
		if err := json.Unmarshal([]byte(body), &ch); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		got, err := ch.SelectedHash()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.params, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.params, got, err, c.want)
		}
	}
}

// The Attestation's JSON has the member names of kbs.yaml.
func TestAttestationJSON(t *testing.T) {
	b, err := json.Marshal(Attestation{
		InitData:    &InitData{Format: "toml", Body: "x"},
		RuntimeData: RuntimeData{Nonce: "n", TeePubKey: json.RawMessage(`{}`)},
		TeeEvidence: CompositeEvidence{PrimaryEvidence: json.RawMessage(`{"quote":"q","cc_eventlog":null}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"init-data":{"format":"toml","body":"x"},"runtime-data":{"nonce":"n","tee-pubkey":{}},"tee-evidence":{"primary_evidence":{"quote":"q","cc_eventlog":null},"additional_evidence":""}}`
	if string(b) != want {
		t.Fatalf("%s\nwant\n%s", b, want)
	}
	tdx, _ := json.Marshal(TDXEvidence{Quote: "cXVvdGU="})
	if string(tdx) != `{"cc_eventlog":null,"quote":"cXVvdGU="}` {
		t.Fatalf("tdx evidence %s", tdx)
	}
}
