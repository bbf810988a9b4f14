package kbs

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
)

// The client's Attestation is what Trustee's KBS reads: a tee-pubkey with
// exactly the members kbs-types' TeePubKey keeps (Trustee re-serializes
// the key before hashing, so any other member would change the digest),
// composite tee-evidence, and REPORT_DATA the sha384 of the canonical
// {additional-evidence, nonce, tee-pubkey} when the challenge's
// extra-params is "" (as Trustee sends it).
func TestClientAttestationAsTrusteeReadsIt(t *testing.T) {
	var att kbsapi.Attestation
	var rawAtt map[string]json.RawMessage
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case kbsapi.AuthPath:
			var req kbsapi.Request
			_ = json.NewDecoder(r.Body).Decode(&req)
			if req.Version != "0.4.0" || req.Tee != "snp" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: kbsapi.CookieName, Value: "s1"})
			_, _ = io.WriteString(w, `{"nonce":"bm9uY2U=","extra-params":""}`)
		case kbsapi.AttestPath:
			b, _ := io.ReadAll(r.Body)
			_ = json.Unmarshal(b, &att)
			_ = json.Unmarshal(b, &rawAtt)
			_, _ = io.WriteString(w, `{"token":"t"}`)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	var gotRD [64]byte
	c := &Client{URL: srv.URL, Roots: roots, Tee: "snp", InitData: []byte("version = \"0.1\"\n"),
		Evidence: func(_ context.Context, rd [64]byte) (string, []byte, error) {
			gotRD = rd
			return "snp", []byte(`{"attestation_report":{},"cert_chain":null}`), nil
		}}
	s, err := c.open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.http.CloseIdleConnections()

	var key map[string]any
	if err := json.Unmarshal(att.RuntimeData.TeePubKey, &key); err != nil {
		t.Fatal(err)
	}
	var names []string
	for k := range key {
		names = append(names, k)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"alg", "crv", "kty", "x", "y"}) || key["kty"] != "EC" || key["crv"] != "P-256" || key["alg"] != "ECDH-ES+A256KW" {
		t.Fatalf("tee-pubkey %s: want exactly kty EC, crv P-256, alg ECDH-ES+A256KW, x, y", att.RuntimeData.TeePubKey)
	}
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(rawAtt["tee-evidence"], &ev); err != nil || string(ev["additional_evidence"]) != `""` ||
		string(ev["primary_evidence"]) != `{"attestation_report":{},"cert_chain":null}` {
		t.Fatalf("tee-evidence %s: want {primary_evidence, additional_evidence: \"\"}", rawAtt["tee-evidence"])
	}
	if att.InitData == nil || att.InitData.Format != "toml" || att.InitData.Body != "version = \"0.1\"\n" {
		t.Fatalf("init-data %+v", att.InitData)
	}
	// Built independently of PrimaryRuntimeData: keys sorted by hand.
	x, _ := json.Marshal(key["x"])
	y, _ := json.Marshal(key["y"])
	canon := `{"additional-evidence":"","nonce":"bm9uY2U=","tee-pubkey":{"alg":"ECDH-ES+A256KW","crv":"P-256","kty":"EC","x":` + string(x) + `,"y":` + string(y) + `}}`
	sum := sha512.Sum384([]byte(canon))
	if string(gotRD[:48]) != string(sum[:]) || [16]byte(gotRD[48:]) != ([16]byte{}) {
		t.Fatalf("REPORT_DATA %x is not the sha384 of %s", gotRD, canon)
	}
}
