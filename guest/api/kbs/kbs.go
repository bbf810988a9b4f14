// Package kbs holds the wire types of the Confidential Containers KBS
// attestation protocol (Request-Challenge-Attestation-Response, as
// Trustee's KBS speaks it, protocol version 0.4.0), the TEE evidence
// encodings Trustee's verifiers read (snp.go), and the binding of the
// runtime data into TEE evidence. The guest's client (guest/kbs) and the
// node's broker (launcher/broker) both use it, so they agree on the format
// and on the digest that goes into REPORT_DATA.
//
// Endpoints, all under /kbs/v0: POST auth (Request → Challenge, with the
// session cookie kbs-session-id), POST attest (Attestation, answered with
// an attestation token), GET resource/REPO/TYPE/TAG (a JWE in flattened
// JSON serialization, encrypted to the ephemeral tee-pubkey).
//
// Sources followed: trustee kbs/docs/kbs_attestation_protocol.md and
// kbs/docs/kbs.yaml (CompositeEvidence), trustee kbs/src/attestation/
// backend.rs (the runtime data the primary evidence binds),
// guest-components attestation-agent/kbs_protocol/src/client/
// rcar_client.rs (the client side of the same binding).
package kbs

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"hash"
	"strings"
)

// ProtocolVersion is the KBS protocol version the client announces;
// Trustee's KBS accepts exactly this version.
const ProtocolVersion = "0.4.0"

// Paths and the session cookie of the protocol.
const (
	Prefix       = "/kbs/v0"
	AuthPath     = Prefix + "/auth"
	AttestPath   = Prefix + "/attest"
	ResourcePath = Prefix + "/resource/"
	CookieName   = "kbs-session-id"
)

// TEE names of the protocol (kbs-types Tee).
const (
	TeeSNP = "snp"
	TeeTDX = "tdx"
)

// Extra-params keys for the runtime-data hash negotiation.
const (
	SupportedHashAlgorithms = "supported-hash-algorithms"
	SelectedHashAlgorithm   = "selected-hash-algorithm"
)

// DefaultHashAlgorithm hashes the runtime data when the challenge selects
// none (Trustee's built-in attestation service uses it for snp and tdx).
const DefaultHashAlgorithm = "sha384"

// Request opens a session (POST /kbs/v0/auth).
type Request struct {
	Version     string         `json:"version"`
	Tee         string         `json:"tee"`
	ExtraParams map[string]any `json:"extra-params"`
}

// Challenge is the broker's answer to a Request. Trustee's KBS sends an
// empty string as extra-params unless its verifier selects a hash
// algorithm, so ExtraParams is any JSON value.
type Challenge struct {
	Nonce       string          `json:"nonce"`
	ExtraParams json.RawMessage `json:"extra-params"`
}

// SelectedHash returns the runtime-data hash the challenge selects
// ("selected-hash-algorithm" in an extra-params object, lower-cased), or
// DefaultHashAlgorithm when it selects none, as guest-components'
// kbs_protocol client reads it.
func (c *Challenge) SelectedHash() (string, error) {
	var params map[string]json.RawMessage
	if json.Unmarshal(c.ExtraParams, &params) != nil || params[SelectedHashAlgorithm] == nil {
		return DefaultHashAlgorithm, nil
	}
	var alg string
	if err := json.Unmarshal(params[SelectedHashAlgorithm], &alg); err != nil {
		return "", fmt.Errorf("kbs: challenge %s is not a string", SelectedHashAlgorithm)
	}
	alg = strings.ToLower(alg)
	if _, err := newHash(alg); err != nil {
		return "", err
	}
	return alg, nil
}

// Attestation answers a Challenge (POST /kbs/v0/attest).
type Attestation struct {
	InitData    *InitData         `json:"init-data,omitempty"`
	RuntimeData RuntimeData       `json:"runtime-data"`
	TeeEvidence CompositeEvidence `json:"tee-evidence"`
}

// CompositeEvidence is the tee-evidence of protocol 0.4.0 (kbs-types
// CompositeEvidence): the primary TEE's evidence and, as a JSON string,
// a map of additional device evidence ("" when there is none).
type CompositeEvidence struct {
	PrimaryEvidence    json.RawMessage `json:"primary_evidence"`
	AdditionalEvidence string          `json:"additional_evidence"`
}

// InitData is the plaintext init data the evidence's HOST_DATA binds.
// Trustee's built-in attestation service reads format "toml" only.
type InitData struct {
	Format string `json:"format"`
	Body   string `json:"body"`
}

// RuntimeData is the runtime data of an Attestation: the challenge's
// nonce and the ephemeral public key (a JWK) the broker wraps resources
// to. The evidence binds it through PrimaryRuntimeData.
type RuntimeData struct {
	Nonce     string          `json:"nonce"`
	TeePubKey json.RawMessage `json:"tee-pubkey"`
}

// TDXEvidence is the primary evidence of the tdx TEE as Trustee's TDX
// verifier deserializes it (deps/verifier/src/tdx: TdxEvidence): the TD
// quote in standard base64 and, optionally, the CC event log (CCEL) in
// standard base64. c8s sends the CCEL when the guest has it (null
// otherwise), and its broker replays it to the quote's RTMRs.
type TDXEvidence struct {
	CCEventLog *string `json:"cc_eventlog"`
	Quote      string  `json:"quote"`
}

// AttestResponse is the body of a successful attest.
type AttestResponse struct {
	Token string `json:"token"`
}

// ErrorInformation is the problem-details body of a failed request.
type ErrorInformation struct {
	Type   string `json:"type"`
	Detail string `json:"detail"`
}

// ErrorTypePrefix starts every ErrorInformation.Type.
const ErrorTypePrefix = "https://github.com/confidential-containers/kbs/errors/"

// HashAlgorithms are the runtime-data hashes this package computes.
var HashAlgorithms = []string{"sha256", "sha384", "sha512"}

func newHash(alg string) (hash.Hash, error) {
	switch alg {
	case "sha256":
		return sha256.New(), nil
	case "sha384":
		return sha512.New384(), nil
	case "sha512":
		return sha512.New(), nil
	}
	return nil, fmt.Errorf("kbs: hash algorithm %q is not supported (supported: %v)", alg, HashAlgorithms)
}

// Canonical returns the JSON document v with object keys sorted, no
// insignificant white space and no HTML escaping: the form whose hash the
// evidence binds. Trustee and guest-components use RFC 8785 (JCS,
// serde_json_canonicalizer); for documents of objects and strings without
// U+2028/U+2029, as runtime data is, the bytes are the same. Numbers are
// kept as written, where JCS would reformat them.
func Canonical(v []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("kbs: runtime data: %w", err)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// PrimaryRuntimeData is the JSON document the primary evidence's
// REPORT_DATA binds in protocol 0.4.0: the runtime data's nonce and
// tee-pubkey, and the composite evidence's additional_evidence string
// (Trustee's KBS and guest-components' client build the same object).
func PrimaryRuntimeData(rt RuntimeData, additionalEvidence string) ([]byte, error) {
	if !json.Valid(rt.TeePubKey) {
		return nil, fmt.Errorf("kbs: runtime data tee-pubkey is not JSON")
	}
	nonce, _ := json.Marshal(rt.Nonce)         // a string always marshals
	add, _ := json.Marshal(additionalEvidence) // likewise
	return json.Marshal(map[string]json.RawMessage{
		"additional-evidence": add,
		"nonce":               nonce,
		"tee-pubkey":          rt.TeePubKey,
	})
}

// ReportData is the REPORT_DATA that binds runtimeData (JSON): its
// canonical form hashed with alg, followed by zeros.
func ReportData(runtimeData []byte, alg string) ([64]byte, error) {
	var rd [64]byte
	h, err := newHash(alg)
	if err != nil {
		return rd, err
	}
	c, err := Canonical(runtimeData)
	if err != nil {
		return rd, err
	}
	h.Write(c)
	copy(rd[:], h.Sum(nil))
	return rd, nil
}
