package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// asMain makes the test binary c8s-verify when set: the tests run it as
// the shim does, across the process boundary.
const asMain = "C8S_VERIFY_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) != "" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func self(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(asMain, "1")
	return p
}

// The shim's side of the exchange (verdict.Run) against the binary: a
// request it can read gets a verdict on stdout, here the refusal of
// evidence whose image manifest does not exist, as the typed error.
func TestVerdictAcrossTheProcess(t *testing.T) {
	bin := self(t)
	nonce, err := verdict.NewNonce()
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "manifest.json")
	v, err := verdict.Run(context.Background(), bin, &verdict.Request{
		Evidence: verdict.Evidence{Kind: "snp", Provider: "sim", Report: []byte{1}},
		TEE:      "sim", Manifest: missing, VCPUs: 1, ReportData: nonce,
		Trusts: []verdict.Trust{{Mode: verdict.ModeSim, SimCertChain: []byte("PEM")}},
	})
	if err != nil {
		t.Fatalf("the exchange: %v", err)
	}
	if err := v.Err(); err == nil || !strings.Contains(err.Error(), "image manifest") || !strings.Contains(err.Error(), missing) {
		t.Fatalf("evidence without its manifest: verdict %+v, refusal %v", v, err)
	}
}

// A request it cannot read, or the wrong arguments, is an error: exit
// status non-zero, the reason on stderr after "verify-evidence: " (what
// verdict.Helper reports), nothing on stdout.
func TestBadRequests(t *testing.T) {
	bin := self(t)
	for _, c := range []struct {
		name  string
		args  []string
		stdin string
		code  int
		want  string
	}{
		{"unknown field", []string{verdict.Subcommand}, `{"evidence": {}, "pin_everything": true}`, 1, "verify-evidence: reading the request on stdin: json: unknown field \"pin_everything\""},
		{"no request", []string{verdict.Subcommand}, "", 1, "verify-evidence: reading the request on stdin: no request"},
		{"two requests", []string{verdict.Subcommand}, `{} {}`, 1, "more than one JSON value"},
		{"no arguments", nil, "", 2, "usage: c8s-verify verify-evidence"},
		{"another subcommand", []string{"verify-report"}, "", 2, "usage: c8s-verify verify-evidence"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(bin, c.args...)
			cmd.Stdin = strings.NewReader(c.stdin)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != c.code {
				t.Fatalf("exit: %v, want status %d (stderr %q)", err, c.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("stderr %q, want %q", stderr.String(), c.want)
			}
			if stdout.Len() != 0 {
				t.Fatalf("stdout %q, want nothing", stdout.String())
			}
		})
	}
}
