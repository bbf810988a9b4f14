package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/config"
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

// verifyWithNodeTrust verifies quote as the shim does with cfg's trust, at
// a time the collateral is valid.
func verifyWithNodeTrust(t *testing.T, cfg config.Config, quote []byte) error {
	t.Helper()
	trusts, _, err := (&Sandbox{}).trust(cfg)
	if err != nil {
		return err
	}
	if len(trusts) != 1 {
		t.Fatalf("%d trusts, want the node's own", len(trusts))
	}
	trusts[0].Now = func() time.Time { return time.Date(2025, time.June, 20, 0, 0, 0, 0, time.UTC) }
	v, err := attest.NewVerifier(trusts[0])
	if err != nil {
		return err
	}
	q, err := attest.ParseTDXQuote(quote)
	if err != nil {
		t.Fatal(err)
	}
	body := q.GetTdQuoteBody()
	_, err = v.VerifyTDX(quote, &attest.Policy{MRTD: body.GetMrTd(), Nonce: body.GetReportData()})
	return err
}

// attestation.collateral_dir reaches the shim's verifier: an out-of-date
// TDX platform, whose quote verifies without collateral, is refused by
// its TCB status with it; a missing directory names the key and how to
// make one.
func TestShimVerifierUsesCollateralDir(t *testing.T) {
	quote, err := os.ReadFile(outdatedQuote)
	if err != nil {
		t.Fatal(err)
	}
	coll, err := filepath.Abs(genuineColl)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Runtime.StateDir = t.TempDir()
	cfg.Hypervisor.TEE = "tdx"
	if err := verifyWithNodeTrust(t, cfg, quote); err != nil {
		t.Fatalf("without collateral the quote's signature and policy verify: %v", err)
	}

	cfg.Attestation.CollateralDir = coll
	err = verifyWithNodeTrust(t, cfg, quote)
	var ae *attest.Error
	if !errors.As(err, &ae) || ae.Kind != attest.KindPolicy || ae.Field != "TDX TCB status" {
		t.Fatalf("an out-of-date platform with attestation.collateral_dir: %v", err)
	}
	t.Log(err)

	cfg.Attestation.CollateralDir = filepath.Join(t.TempDir(), "absent")
	err = verifyWithNodeTrust(t, cfg, quote)
	if err == nil || !strings.Contains(err.Error(), "attestation.collateral_dir") || !strings.Contains(err.Error(), "c8s-launcher collateral fetch") {
		t.Fatalf("a missing collateral directory: %v", err)
	}
	t.Log(err)
}
