// Package attest verifies a pod VM's attestation evidence against a policy
// before the pod may run: SEV-SNP ATTESTATION_REPORTs with go-sev-guest's
// verify (certificate chain and signature) and validate packages, TDX
// quotes with go-tdx-guest's. A Verifier holds the node's trust anchors
// (Trust): AMD's or Intel's embedded roots on hardware, the node's
// simulated secure processor (launcher/vm/tee/sim) in `sim` mode, never
// both. A Policy holds what one VM's evidence must show: the expected
// measurement per vCPU shape, the minimum TCB, no debug, HOST_DATA or
// MRCONFIGID, and the nonce that makes the evidence fresh.
//
// Every rejection is an *Error naming the field, with the expected and the
// actual value and a hint at the likely cause, for example
//
//	measurement mismatch: expected 3f2a…, got 9c1e… (vCPUs=2; the firmware, kernel, initrd or command line differs from the manifest?)
//
// Chains that verified once are cached per Verifier, so verifying further
// reports of the same chip costs about one ECDSA P-384 verification.
package attest

import (
	"fmt"
	"strings"
)

// Kind classifies a verification failure.
type Kind int

const (
	// KindConfig: the policy or the trust configuration cannot be used.
	KindConfig Kind = iota + 1
	// KindFormat: the evidence is malformed (truncated, unknown version, …).
	KindFormat
	// KindRoot: the evidence comes from a root this verifier must not trust
	// (a simulated chain on hardware, a hardware chain in sim mode).
	KindRoot
	// KindSignature: the certificate chain or the evidence's signature does
	// not verify.
	KindSignature
	// KindMismatch: a field differs from the value the policy expects.
	KindMismatch
	// KindPolicy: a field violates a policy rule (debug, minimum TCB, …).
	KindPolicy
	// KindNetwork: collateral (a certificate, a CRL, TCB info) had to be
	// fetched and the network did not deliver it: nothing about the
	// evidence was decided.
	KindNetwork
	// KindRevoked: a certificate of the evidence's chain is revoked by its
	// issuer's CRL.
	KindRevoked
)

func (k Kind) String() string {
	switch k {
	case KindConfig:
		return "config"
	case KindFormat:
		return "format"
	case KindRoot:
		return "root"
	case KindSignature:
		return "signature"
	case KindMismatch:
		return "mismatch"
	case KindPolicy:
		return "policy"
	case KindNetwork:
		return "network"
	case KindRevoked:
		return "revoked"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Error is a verification failure: which field, what was expected, what
// the evidence holds, and a hint at the cause.
type Error struct {
	Kind Kind
	// Field names what failed: "measurement", "REPORT_DATA", "HOST_DATA",
	// "TCB", "guest policy", "report signature", "MRTD", …
	Field string
	// Expected and Actual are the values, hex for digests; empty when the
	// failure has no single expected value.
	Expected string
	Actual   string
	// Hint suggests the likely cause.
	Hint string
	// Err is the underlying library error, if any.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.Kind == KindMismatch:
		fmt.Fprintf(&b, "%s mismatch: expected %s, got %s", e.Field, e.Expected, e.Actual)
	case e.Expected != "" || e.Actual != "":
		fmt.Fprintf(&b, "%s: expected %s, got %s", e.Field, e.Expected, e.Actual)
	default:
		b.WriteString(e.Field)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if e.Hint != "" {
		fmt.Fprintf(&b, " (%s)", e.Hint)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

func mismatch(field, expected, actual, hint string) *Error {
	return &Error{Kind: KindMismatch, Field: field, Expected: expected, Actual: actual, Hint: hint}
}

func failure(kind Kind, field string, err error, hint string) *Error {
	return &Error{Kind: kind, Field: field, Err: err, Hint: hint}
}

// recoverMalformed turns a panic of an evidence parser into a format error
// in *err: malformed evidence must never take the verifier down.
func recoverMalformed(what string, err *error) {
	if r := recover(); r != nil {
		*err = failure(KindFormat, what, fmt.Errorf("the parser failed on malformed input: %v", r), "")
	}
}
