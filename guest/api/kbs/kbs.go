// Package kbs holds the wire types of the Confidential Containers KBS
// attestation protocol (Request-Challenge-Attestation-Response, as
// Trustee's KBS speaks it, protocol version 0.4.0) and the binding of its
// runtime data into TEE evidence. The guest's client (guest/kbs) and the
// node's broker (launcher/kbs) both use it, so they agree on the format
// and on the digest that goes into REPORT_DATA.
//
// Endpoints, all under /kbs/v0: POST auth (Request → Challenge, with the
// session cookie kbs-session-id), POST attest (Attestation, answered with
// an attestation token), GET resource/REPO/TYPE/TAG (a JWE in flattened
// JSON serialization, encrypted to the ephemeral tee-pubkey).
package kbs

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"hash"
)

// ProtocolVersion is the KBS protocol version the client announces.
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
// none.
const DefaultHashAlgorithm = "sha384"

// Request opens a session (POST /kbs/v0/auth).
type Request struct {
	Version     string         `json:"version"`
	Tee         string         `json:"tee"`
	ExtraParams map[string]any `json:"extra-params"`
}

// Challenge is the broker's answer to a Request.
type Challenge struct {
	Nonce       string         `json:"nonce"`
	ExtraParams map[string]any `json:"extra-params"`
}

// Attestation answers a Challenge (POST /kbs/v0/attest).
type Attestation struct {
	InitData    *InitData       `json:"init-data,omitempty"`
	RuntimeData json.RawMessage `json:"runtime-data"`
	TeeEvidence json.RawMessage `json:"tee-evidence"`
}

// InitData is the plaintext init data the evidence's HOST_DATA binds.
type InitData struct {
	Format string `json:"format"`
	Body   string `json:"body"`
}

// RuntimeData is what the evidence binds through REPORT_DATA: the
// challenge's nonce and the ephemeral public key (a JWK) the broker wraps
// resources to.
type RuntimeData struct {
	Nonce     string          `json:"nonce"`
	TeePubKey json.RawMessage `json:"tee-pubkey"`
}

// SNPEvidence is c8s's tee-evidence for the snp TEE: the raw
// ATTESTATION_REPORT and the extended report's certificate table.
type SNPEvidence struct {
	Report    []byte `json:"report"`
	CertTable []byte `json:"cert_table,omitempty"`
	// Provider is where the guest got it ("sim", "sev-guest", ...).
	Provider string `json:"provider,omitempty"`
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
// evidence binds (the same bytes serde_json produces for a Value).
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
