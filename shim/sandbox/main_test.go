package sandbox

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// The test binary is also the tests' evidence verifier: run as `TESTBIN
// verify-evidence` with verifierEnv set, it is what c8s-verify is
// (attest.ServeVerdict), so that the shim's attestation is tested across
// the same process boundary as in a node. clockEnv (RFC 3339) sets the
// time certificates and collateral are judged at, for recorded evidence.
const (
	verifierEnv = "C8S_SANDBOX_TEST_VERIFIER"
	clockEnv    = "C8S_SANDBOX_TEST_VERIFY_AT"
)

func TestMain(m *testing.M) {
	if os.Getenv(verifierEnv) != "" && len(os.Args) > 1 && os.Args[1] == verdict.Subcommand {
		os.Exit(serveVerifier())
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv(verifierEnv, "1")
	Verifier = self
	os.Exit(m.Run())
}

func serveVerifier() int {
	var now func() time.Time
	if at := os.Getenv(clockEnv); at != "" {
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		now = func() time.Time { return t }
	}
	if err := attest.ServeVerdictAt(os.Stdin, os.Stdout, now); err != nil {
		fmt.Fprintf(os.Stderr, "c8s-verify %s: %v\n", verdict.Subcommand, err)
		return 1
	}
	return 0
}
