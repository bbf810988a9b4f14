package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// Genuine public TDX evidence and Intel collateral, from launcher/attest's
// test data (see its testdata/tdx/README.md for sources and licenses):
// dstack's quote, whose platform is below every TCB level of Intel's TCB
// info for its FMSPC, and that collateral, valid 2025-06-19 to 2025-07-19.
const (
	tdxTestdata   = "../../launcher/attest/testdata/tdx/"
	outdatedQuote = tdxTestdata + "dstack/quote.bin"
	genuineColl   = tdxTestdata + "dcap-qvl/collateral-b0c06f"
)

// attestation.collateral_dir reaches the verifier the shim runs: an
// out-of-date TDX platform, whose quote's signature verifies without
// collateral (it then fails on the manifest's MRTD), is refused by its TCB
// status with it, and that refusal arrives in the shim as the typed
// *verdict.Error the verifier returned; a missing directory names the key
// and how to make one.
func TestShimVerifierUsesCollateralDir(t *testing.T) {
	quote, err := os.ReadFile(outdatedQuote)
	if err != nil {
		t.Fatal(err)
	}
	coll, err := filepath.Abs(genuineColl)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := setup(t, map[string]string{"1": strings.Repeat("11", 48)})
	cfg.Hypervisor.TEE = "tdx"
	t.Setenv(clockEnv, "2025-06-20T00:00:00Z")
	attestQuote := func() error {
		g := &fakeGuest{evidence: func([]byte) *agent.GetEvidenceResponse {
			return &agent.GetEvidenceResponse{Kind: "tdx", Provider: "tdx-guest", Report: quote}
		}}
		_, err := (&Sandbox{Agent: g}).Attest(context.Background(), cfg)
		return err
	}

	var ae *verdict.Error
	if err := attestQuote(); !errors.As(err, &ae) || ae.Kind != verdict.KindMismatch || ae.Field != "MRTD" {
		t.Fatalf("without collateral the quote's signature verifies and its MRTD is not the manifest's: %v", err)
	}

	cfg.Attestation.CollateralDir = coll
	err = attestQuote()
	if !errors.As(err, &ae) || ae.Kind != verdict.KindPolicy || ae.Field != "TDX TCB status" || ae.Actual == "" {
		t.Fatalf("an out-of-date platform with attestation.collateral_dir: %#v", err)
	}
	t.Log(err)

	cfg.Attestation.CollateralDir = filepath.Join(t.TempDir(), "absent")
	err = attestQuote()
	if err == nil || !strings.Contains(err.Error(), "attestation.collateral_dir") || !strings.Contains(err.Error(), "c8s-launcher collateral fetch") {
		t.Fatalf("a missing collateral directory: %v", err)
	}
	t.Log(err)
}
