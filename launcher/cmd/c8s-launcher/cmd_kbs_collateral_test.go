package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/attest"
)

// kbs --collateral (and mesh-ca, which shares the flags) gives the
// broker's verifier the offline collateral: a genuine TDX quote that
// verifies without it is refused with it, by the collateral's judgement
// (the genuine collateral of launcher/attest's test data is past its next
// update after 2025-07-19, and before it rates the platform below every
// TCB level; the broker's clock cannot be set from its flags); a missing
// directory is refused at start, naming the flag.
func TestKBSCollateralFlag(t *testing.T) {
	quote, err := os.ReadFile("../../attest/testdata/tdx/dstack/quote.bin")
	if err != nil {
		t.Fatal(err)
	}
	q, err := attest.ParseTDXQuote(quote)
	if err != nil {
		t.Fatal(err)
	}
	body := q.GetTdQuoteBody()
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.json")
	rtmrs := body.GetRtmrs()
	if err := os.WriteFile(policy, fmt.Appendf(nil, `{"mrtd":"%s","rtmrs":["","%s","%s",""]}`,
		attest.Hex(body.GetMrTd()), attest.Hex(rtmrs[1]), attest.Hex(rtmrs[2])), 0o600); err != nil {
		t.Fatal(err)
	}
	want := &attest.Policy{MRTD: body.GetMrTd(), Nonce: body.GetReportData()}
	verify := func(collateral string) error {
		t.Helper()
		o := kbsFlags{tee: "tdx", policyPath: policy, anyInitData: true, collateralDir: collateral, noCollateral: collateral == ""}
		b, tee, err := newKBSBroker(o, io.Discard)
		if err != nil {
			return err
		}
		if tee != "tdx" {
			t.Fatalf("tee %q", tee)
		}
		_, err = b.Verifier.VerifyTDX(quote, want)
		return err
	}
	if err := verify(""); err != nil {
		t.Fatalf("without --collateral: %v", err)
	}
	err = verify("../../attest/testdata/tdx/dcap-qvl/collateral-b0c06f")
	var ae *attest.Error
	if !errors.As(err, &ae) || ae.Field != "TDX TCB status" && !strings.Contains(ae.Hint, "fetch fresh collateral") {
		t.Fatalf("with --collateral: %v", err)
	}
	t.Log(err)
	err = verify(filepath.Join(dir, "absent"))
	if err == nil || !strings.Contains(err.Error(), "--collateral") || !strings.Contains(err.Error(), "collateral fetch") {
		t.Fatalf("a missing --collateral directory: %v", err)
	}
	fs := newFlags("kbs")
	var o kbsFlags
	o.registerVerification(fs)
	if err := fs.Parse([]string{"--collateral", "/var/lib/c8s/collateral"}); err != nil || o.collateralDir != "/var/lib/c8s/collateral" {
		t.Fatalf("--collateral parsed to %q: %v", o.collateralDir, err)
	}
}

// TestKBSRefusesTDXPolicyWithoutBoot: a --policy that pins a TD's MRTD,
// its firmware, and neither its tdx_boot nor RTMR1 and RTMR2 would have
// the broker serve a TD running any kernel, initrd and command line: the
// broker does not start, and says what to add.
func TestKBSRefusesTDXPolicyWithoutBoot(t *testing.T) {
	mrtd, r := strings.Repeat("ab", 48), strings.Repeat("cd", 48)
	for _, c := range []struct {
		name, policy string
		refused      bool
	}{
		{"mrtd only", `{"mrtd":"` + mrtd + `"}`, true},
		{"rtmr1 only", `{"mrtd":"` + mrtd + `","rtmrs":["","` + r + `"]}`, true},
		{"rtmr2 only", `{"mrtd":"` + mrtd + `","rtmrs":["","","` + r + `"]}`, true},
		{"rtmr1 and rtmr2", `{"mrtd":"` + mrtd + `","rtmrs":["","` + r + `","` + r + `"]}`, false},
		{"tdx_boot", `{"mrtd":"` + mrtd + `","tdx_boot":{"kernel":"` + r + `","load_options":"` + r + `"}}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			policy := filepath.Join(t.TempDir(), "policy.json")
			if err := os.WriteFile(policy, []byte(c.policy), 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, err := newKBSBroker(kbsFlags{tee: "tdx", policyPath: policy, anyInitData: true, noCollateral: true}, io.Discard)
			switch {
			case c.refused && (err == nil || !strings.Contains(err.Error(), "tdx_boot") || !strings.Contains(err.Error(), policy)):
				t.Fatalf("%s: %v, want a refusal naming the policy and tdx_boot", c.policy, err)
			case !c.refused && err != nil:
				t.Fatalf("%s: %v", c.policy, err)
			}
		})
	}
}

// TestKBSNeedsCollateral: for snp and tdx the broker judges the platform's
// TCB status and certificate revocation with offline collateral; without
// --collateral it does not start, unless told --no-collateral.
func TestKBSNeedsCollateral(t *testing.T) {
	mrtd, r := strings.Repeat("ab", 48), strings.Repeat("cd", 48)
	policy := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(policy, []byte(`{"mrtd":"`+mrtd+`","rtmrs":["","`+r+`","`+r+`"],"measurements":{"1":"`+mrtd+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tee := range []string{"tdx", "snp"} {
		_, _, err := newKBSBroker(kbsFlags{tee: tee, policyPath: policy, anyInitData: true}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--collateral DIR") || !strings.Contains(err.Error(), "--no-collateral") {
			t.Errorf("--tee %s without --collateral: %v, want a refusal naming --collateral and --no-collateral", tee, err)
		}
		if _, _, err := newKBSBroker(kbsFlags{tee: tee, policyPath: policy, anyInitData: true, noCollateral: true}, io.Discard); err != nil {
			t.Errorf("--tee %s --no-collateral: %v", tee, err)
		}
	}
}
