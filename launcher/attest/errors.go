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
// The claims, the errors and Hex are launcher/attest/verdict's types
// (aliases), which cross process boundaries: the shim has evidence
// verified by `c8s-verify verify-evidence` (Decide) and gets back the
// same *Error, with the same text.
//
// Chains that verified once are cached per Verifier, so verifying further
// reports of the same chip costs about one ECDSA P-384 verification.
package attest

import (
	"fmt"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// Kind classifies a verification failure (verdict.Kind: the type crosses
// to the processes that read verdicts).
type Kind = verdict.Kind

// The kinds of failure.
const (
	KindConfig    = verdict.KindConfig
	KindFormat    = verdict.KindFormat
	KindRoot      = verdict.KindRoot
	KindSignature = verdict.KindSignature
	KindMismatch  = verdict.KindMismatch
	KindPolicy    = verdict.KindPolicy
	KindNetwork   = verdict.KindNetwork
	KindRevoked   = verdict.KindRevoked
)

// Error is a verification failure: which field, what was expected, what
// the evidence holds, and a hint at the cause (verdict.Error).
type Error = verdict.Error

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
