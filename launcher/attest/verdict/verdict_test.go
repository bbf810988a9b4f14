package verdict

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary is also the fake helper: run as `TESTBIN
// verify-evidence` with helperEnv set to a behaviour, it behaves so.
const helperEnv = "C8S_VERDICT_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" && len(os.Args) > 1 && os.Args[1] == Subcommand {
		os.Exit(fakeHelper(mode))
	}
	os.Exit(m.Run())
}

// refusal is what the "refuse" helper answers.
var refusal = &Error{Kind: KindMismatch, Field: "measurement", Expected: "aa", Actual: "bb", Hint: "the kernel differs?"}

func fakeHelper(mode string) int {
	switch mode {
	case "accept", "refuse", "refuse-joined":
		return exitOf(Serve(os.Stdin, os.Stdout, func(r *Request) *Verdict {
			switch mode {
			case "refuse":
				return &Verdict{Failure: NewFailure(refusal)}
			case "refuse-joined":
				sig := &Error{Kind: KindSignature, Field: "report signature", Err: errors.New("ECDSA verification failed")}
				return &Verdict{Failure: NewFailure(fmt.Errorf("no root: %w", errors.Join(sig, refusal)))}
			}
			// Echo what arrived, so the test sees the request crossed whole.
			return &Verdict{SNP: &SNPClaims{Mode: Mode(r.TEE), VCPUs: r.VCPUs, ReportData: r.ReportData, ChipID: r.ChipID, HostData: r.Evidence.Report}}
		}))
	case "bad-json":
		_, _ = io.Copy(io.Discard, os.Stdin)
		fmt.Print(`{"snp": {"vcpus": "one"`)
	case "empty-verdict":
		_, _ = io.Copy(io.Discard, os.Stdin)
		fmt.Print(`{}`)
	case "two-verdicts":
		_, _ = io.Copy(io.Discard, os.Stdin)
		fmt.Print(`{"snp": {}, "failure": {"message": "no"}}`)
	case "fail":
		_, _ = io.Copy(io.Discard, os.Stdin)
		fmt.Fprintf(os.Stderr, "c8s-launcher %s: attestation.manifest unreadable\n", Subcommand)
		return 1
	case "killed":
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
	case "hang":
		time.Sleep(time.Minute)
	}
	return 0
}

func exitOf(err error) int {
	if err != nil {
		fmt.Fprintf(os.Stderr, "c8s-launcher %s: %v\n", Subcommand, err)
		return 1
	}
	return 0
}

func self(t *testing.T, mode string) string {
	t.Helper()
	t.Setenv(helperEnv, mode)
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func request() *Request {
	return &Request{
		Evidence:   Evidence{Kind: "snp", Provider: "sim", Report: []byte{1, 2, 3}},
		TEE:        "sim",
		Manifest:   "/m.json",
		VCPUs:      2,
		ReportData: bytes.Repeat([]byte{7}, 64),
		ChipID:     []byte{9, 9},
		Trusts:     []Trust{{Mode: ModeSim, SimCertChain: []byte("PEM")}},
	}
}

func TestRunCarriesTheRequestAndTheClaims(t *testing.T) {
	v, err := Run(context.Background(), self(t, "accept"), request())
	if err != nil {
		t.Fatal(err)
	}
	if v.Err() != nil || v.SNP == nil || v.TDX != nil {
		t.Fatalf("verdict %+v", v)
	}
	c := v.SNP
	if c.Mode != ModeSim || c.VCPUs != 2 || !bytes.Equal(c.ReportData, request().ReportData) || !bytes.Equal(c.ChipID, []byte{9, 9}) || !bytes.Equal(c.HostData, []byte{1, 2, 3}) {
		t.Fatalf("claims %+v: the request did not cross whole", c)
	}
}

// A refusal crosses as the typed error it was: the same text, and
// errors.As finds an *Error with its fields.
func TestRefusalKeepsItsType(t *testing.T) {
	v, err := Run(context.Background(), self(t, "refuse"), request())
	if err != nil {
		t.Fatal(err)
	}
	got := v.Err()
	var e *Error
	if !errors.As(got, &e) || *e != *refusal || got.Error() != refusal.Error() {
		t.Fatalf("refusal = %#v (%v), want %#v", got, got, refusal)
	}

	// Several roots tried: the text whole, each *Error reachable.
	v, err = Run(context.Background(), self(t, "refuse-joined"), request())
	if err != nil {
		t.Fatal(err)
	}
	got = v.Err()
	want := fmt.Errorf("no root: %w", errors.Join(&Error{Kind: KindSignature, Field: "report signature", Err: errors.New("ECDSA verification failed")}, refusal))
	if got.Error() != want.Error() {
		t.Fatalf("joined refusal text %q, want %q", got, want)
	}
	if !errors.As(got, &e) || e.Kind != KindSignature || e.Err == nil || e.Err.Error() != "ECDSA verification failed" {
		t.Fatalf("first *Error of the joined refusal: %#v", e)
	}
	var kinds []Kind
	for _, x := range got.(interface{ Unwrap() []error }).Unwrap() {
		kinds = append(kinds, x.(*Error).Kind)
	}
	if fmt.Sprint(kinds) != fmt.Sprint([]Kind{KindSignature, KindMismatch}) {
		t.Fatalf("the joined refusal's errors: %v", kinds)
	}
}

func TestFailureRoundTrip(t *testing.T) {
	for _, err := range []error{
		refusal,
		&Error{Kind: KindRevoked, Field: "ASK", Err: errors.New("serial 12 revoked"), Hint: "update"},
		fmt.Errorf("attestation.collateral_dir: %w", &Error{Kind: KindConfig, Field: "collateral", Err: os.ErrNotExist}),
		errors.New("the guest returned \"x\" evidence"),
	} {
		b, jerr := json.Marshal(NewFailure(err))
		if jerr != nil {
			t.Fatal(jerr)
		}
		var f Failure
		if jerr := json.Unmarshal(b, &f); jerr != nil {
			t.Fatal(jerr)
		}
		got := f.Err()
		if got.Error() != err.Error() {
			t.Errorf("text %q, want %q", got, err)
		}
		var want, have *Error
		if errors.As(err, &want) != errors.As(got, &have) {
			t.Errorf("%v: typed error lost or invented", err)
		} else if want != nil && (want.Kind != have.Kind || want.Field != have.Field || want.Hint != have.Hint || want.Expected != have.Expected || want.Actual != have.Actual) {
			t.Errorf("%v: decoded %#v", err, have)
		}
	}
	if (*Failure)(nil).Err() != nil || NewFailure(nil) != nil {
		t.Error("no failure is no error")
	}
	bad := &Failure{Message: "m", Attest: []WireError{{Kind: "novel"}}}
	if err := bad.Err(); err == nil || !strings.Contains(err.Error(), `unknown attestation error kind "novel"`) || !strings.HasPrefix(err.Error(), "m") {
		t.Errorf("an unknown kind: %v", err)
	}
}

// The exchange's failures are errors naming the helper and the cause,
// never verdicts.
func TestRunFailures(t *testing.T) {
	for mode, want := range map[string]string{
		"bad-json":      "not a verdict",
		"empty-verdict": "exactly one of snp, tdx and failure; this one holds 0",
		"two-verdicts":  "this one holds 2",
		"fail":          "failed: attestation.manifest unreadable (exit status 1)",
		"killed":        "signal: killed",
	} {
		t.Run(mode, func(t *testing.T) {
			v, err := Run(context.Background(), self(t, mode), request())
			if err == nil || v != nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), Subcommand) {
				t.Fatalf("verdict %+v, err %v; want an error with %q", v, err, want)
			}
		})
	}

	missing := filepath.Join(t.TempDir(), "c8s-launcher")
	if _, err := Run(context.Background(), missing, request()); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("a missing helper: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Run(ctx, self(t, "hang"), request()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a helper that hangs past ctx: %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the hanging helper was not killed: Run took %s", d)
	}
}

// A started helper that gets no request (the guest gave no evidence) is
// killed and reaped by Close.
func TestCloseReapsAnUnusedHelper(t *testing.T) {
	h, err := Start(context.Background(), self(t, "hang"))
	if err != nil {
		t.Fatal(err)
	}
	pid := h.cmd.Process.Pid
	h.Close()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("helper %d still exists after Close: %v", pid, err)
	}
}

// Serve refuses what it cannot fully understand: a field it does not
// know would be a check it silently skips.
func TestServeRefusesUnknownFieldsAndGarbage(t *testing.T) {
	decide := func(*Request) *Verdict { return &Verdict{Failure: &Failure{Message: "decided"}} }
	for name, in := range map[string]string{
		"unknown field": `{"evidence": {"kind": "snp"}, "trusts": [], "min_tcb_v2": 1}`,
		"not JSON":      `evidence`,
		"two values":    `{} {}`,
	} {
		var out bytes.Buffer
		if err := Serve(strings.NewReader(in), &out, decide); err == nil || out.Len() != 0 {
			t.Errorf("%s: err %v, out %q", name, err, out.String())
		}
	}
	var out bytes.Buffer
	if err := Serve(strings.NewReader(`{"tee": "sim"}`), &out, func(*Request) *Verdict { return &Verdict{} }); err == nil || out.Len() != 0 {
		t.Errorf("a decider's empty verdict was written: %v %q", err, out.String())
	}
}
