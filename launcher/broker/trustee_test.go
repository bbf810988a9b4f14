package broker

import (
	"context"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/testing/testdata"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/launcher/attest"
)

// Like Trustee's KBS with its built-in attestation service, the challenge
// carries an empty string as extra-params (the client then hashes with
// sha384).
func TestChallengeAsTrustee(t *testing.T) {
	f := newFixture(t)
	ch := f.rawSession(t).auth()
	if string(ch.ExtraParams) != `""` || len(ch.Nonce) == 0 {
		t.Fatalf("challenge extra-params %s nonce %q", ch.ExtraParams, ch.Nonce)
	}
}

// A pod with CoCo init data: HOST_DATA is the first 32 bytes of the
// document's sha384, the broker reads the agent policy from c8s.toml.
func TestCoCoInitDataReleased(t *testing.T) {
	f := newFixture(t)
	f.launch("version = \"0.1.0\"\nalgorithm = \"sha384\"\n[data]\n\"c8s.toml\" = '''\n" + f.doc(podInitData[len("version = \"0.1\"\n"):]) + "'''\n")
	sum := sha512.Sum384(f.initData)
	if d := initdata.Digest(f.initData); string(d[:]) != string(sum[:32]) {
		t.Fatalf("HOST_DATA %x, want sha384[:32] %x", d, sum[:32])
	}
	c := f.client()
	got, err := c.Fetch(context.Background(), []string{"default/key/db-password"})
	if err != nil || string(got[0]) != secret {
		t.Fatalf("Fetch = %q, %v", got, err)
	}
	// The same document in audit mode is refused.
	f.launch(strings.Replace(string(f.initData), "[policy]\n", "[policy]\naudit = true\n", 1))
	c.InitData = f.initData
	if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err == nil || !strings.Contains(err.Error(), "audit mode") {
		t.Fatalf("audit mode: err %v", err)
	}
}

// Evidence Trustee's deserializer would refuse (a missing field, the old
// base64 encoding) is refused, and so is additional device evidence the
// CPU evidence does not bind (put in after the report was made; device
// evidence that is bound is gpu_test.go's).
func TestEvidenceShapeRefused(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct {
		name   string
		mutate func(*kbsapi.Attestation)
		want   string
	}{
		{"missing chip_id", func(a *kbsapi.Attestation) {
			a.TeeEvidence.PrimaryEvidence = json.RawMessage(strings.Replace(string(a.TeeEvidence.PrimaryEvidence), `"chip_id":`, `"chip_idx":`, 1))
		}, "missing chip_id"},
		{"missing tcb field", func(a *kbsapi.Attestation) {
			a.TeeEvidence.PrimaryEvidence = json.RawMessage(strings.Replace(string(a.TeeEvidence.PrimaryEvidence), `"microcode":`, `"ucode":`, 1))
		}, "missing microcode"},
		{"additional evidence", func(a *kbsapi.Attestation) { a.TeeEvidence.AdditionalEvidence = `{"sampledevice":{}}` }, "REPORT_DATA (nonce) mismatch"},
		{"c8s's old encoding", func(a *kbsapi.Attestation) {
			a.TeeEvidence.PrimaryEvidence = json.RawMessage(`{"report":"AAAA","cert_table":"AAAA","provider":"sim"}`)
		}, "missing attestation_report"},
	} {
		s := f.rawSession(t)
		att := s.attestation(s.auth())
		c.mutate(&att)
		st, body := s.post(kbsapi.AttestPath, att)
		if st != http.StatusUnauthorized || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: %d %s, want 401 naming %q", c.name, st, body, c.want)
		}
	}
}

// tdx evidence in the encoding of Trustee's TDX verifier reaches the
// verifier: a published sample quote (go-tdx-guest's test data) passes its
// signature and MRTD/MRCONFIGID checks and fails only on REPORT_DATA,
// which cannot bind this session's nonce.
func TestTDXEvidenceDecoded(t *testing.T) {
	v, err := attest.NewVerifier(attest.Trust{Mode: attest.ModeTDX, Now: func() time.Time { return time.Date(2023, time.July, 1, 1, 0, 0, 0, time.UTC) }})
	if err != nil {
		t.Fatal(err)
	}
	q, err := attest.ParseTDXQuote(testdata.RawQuote)
	if err != nil {
		t.Fatal(err)
	}
	body := q.GetTdQuoteBody()
	// The sample quote comes without its init data: only under
	// AllowUnconfinedHost is it checked against the pinned MRCONFIGID
	// alone.
	b := &Broker{Verifier: v, Resources: Map{}, AllowUnconfinedHost: true,
		Policy: attest.Policy{MRTD: body.GetMrTd(), MRConfigID: body.GetMrConfigId()}}
	srv, roots := tlsServer(t, b)
	f := &fixture{srv: srv, roots: roots, broker: b}
	s := f.rawSession(t)
	st, raw := s.post(kbsapi.AuthPath, kbsapi.Request{Version: kbsapi.ProtocolVersion, Tee: kbsapi.TeeTDX, ExtraParams: map[string]any{}})
	var ch kbsapi.Challenge
	if st != http.StatusOK || json.Unmarshal(raw, &ch) != nil {
		t.Fatalf("auth: %d %s", st, raw)
	}
	ev, _ := json.Marshal(kbsapi.TDXEvidence{Quote: base64.StdEncoding.EncodeToString(testdata.RawQuote)})
	att := kbsapi.Attestation{
		RuntimeData: kbsapi.RuntimeData{Nonce: ch.Nonce, TeePubKey: json.RawMessage(`{"kty":"EC","crv":"P-256","alg":"ECDH-ES+A256KW","x":"weNJy2HscCSM6AEDTDg04biOvhFhyyWvOHQfeF_PxMQ","y":"e8lnCO-AlStT-NJVX-crhB7QRYhiix03illJOVAOyck"}`)},
		TeeEvidence: kbsapi.CompositeEvidence{PrimaryEvidence: ev},
	}
	st, raw = s.post(kbsapi.AttestPath, att)
	if st != http.StatusUnauthorized || !strings.Contains(string(raw), "REPORT_DATA") || strings.Contains(string(raw), "signature") {
		t.Fatalf("%d %s: want a REPORT_DATA mismatch after the signature verified", st, raw)
	}
	// The quote in another encoding never reaches the verifier.
	att.TeeEvidence.PrimaryEvidence = json.RawMessage(`{"quote":"` + hex.EncodeToString(testdata.RawQuote[:16]) + `!"}`)
	s = f.rawSession(t)
	st, raw = s.post(kbsapi.AuthPath, kbsapi.Request{Version: kbsapi.ProtocolVersion, Tee: kbsapi.TeeTDX, ExtraParams: map[string]any{}})
	if st != http.StatusOK || json.Unmarshal(raw, &ch) != nil {
		t.Fatalf("second auth: %d %s", st, raw)
	}
	att.RuntimeData.Nonce = ch.Nonce
	if st, raw = s.post(kbsapi.AttestPath, att); st != http.StatusUnauthorized || !strings.Contains(string(raw), "base64") {
		t.Fatalf("%d %s: want a base64 refusal", st, raw)
	}
}
