package verdict

import (
	"errors"
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

var kindNames = map[Kind]string{
	KindConfig: "config", KindFormat: "format", KindRoot: "root", KindSignature: "signature",
	KindMismatch: "mismatch", KindPolicy: "policy", KindNetwork: "network", KindRevoked: "revoked",
}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// parseKind is String's inverse; unknown names are an error.
func parseKind(s string) (Kind, error) {
	for k, name := range kindNames {
		if name == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown attestation error kind %q", s)
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
	// Err is the underlying library error, if any. An Error decoded from a
	// verdict carries it as its text only.
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

// Failure is an error as it crosses the process boundary: its text, and
// the typed attestation errors (*Error) it holds, whether it is one, wraps
// one (fmt.Errorf's %w) or joins several (errors.Join: one per trusted
// root that was tried).
type Failure struct {
	// Message is the error's text, as the verifier printed it.
	Message string `json:"message"`
	// Attest are the *Errors in it, in the order errors.As would find them
	// (depth first).
	Attest []WireError `json:"attest,omitempty"`
}

// WireError is an *Error's fields; Cause is the text of its Err.
type WireError struct {
	Kind     string `json:"kind"`
	Field    string `json:"field"`
	Expected string `json:"expected,omitempty"`
	Actual   string `json:"actual,omitempty"`
	Hint     string `json:"hint,omitempty"`
	Cause    string `json:"cause,omitempty"`
}

// NewFailure encodes err (nil: nil).
func NewFailure(err error) *Failure {
	if err == nil {
		return nil
	}
	f := &Failure{Message: err.Error()}
	for _, e := range attestErrors(err, nil) {
		w := WireError{Kind: e.Kind.String(), Field: e.Field, Expected: e.Expected, Actual: e.Actual, Hint: e.Hint}
		if e.Err != nil {
			w.Cause = e.Err.Error()
		}
		f.Attest = append(f.Attest, w)
	}
	return f
}

// attestErrors collects the *Errors of err's tree, depth first, without
// descending into an *Error (its Err is a library's).
func attestErrors(err error, out []*Error) []*Error {
	if e, ok := err.(*Error); ok {
		return append(out, e)
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		if next := u.Unwrap(); next != nil {
			return attestErrors(next, out)
		}
	case interface{ Unwrap() []error }:
		for _, next := range u.Unwrap() {
			out = attestErrors(next, out)
		}
	}
	return out
}

// Err decodes f: an *Error when f is exactly one, else an error with f's
// text that wraps its *Errors (errors.As finds the first; errors.Is and
// Unwrap see them all).
func (f *Failure) Err() error {
	if f == nil {
		return nil
	}
	errs := make([]error, 0, len(f.Attest))
	for _, w := range f.Attest {
		k, err := parseKind(w.Kind)
		if err != nil {
			return fmt.Errorf("%s (%w)", f.Message, err)
		}
		e := &Error{Kind: k, Field: w.Field, Expected: w.Expected, Actual: w.Actual, Hint: w.Hint}
		if w.Cause != "" {
			e.Err = errors.New(w.Cause)
		}
		errs = append(errs, e)
	}
	if len(errs) == 1 && errs[0].Error() == f.Message {
		return errs[0]
	}
	return &remote{msg: f.Message, errs: errs}
}

// remote is a decoded Failure that is not exactly one *Error.
type remote struct {
	msg  string
	errs []error
}

func (r *remote) Error() string   { return r.msg }
func (r *remote) Unwrap() []error { return r.errs }
