package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/google/go-sev-guest/abi"
)

func init() {
	register("verify-report", "verify an SNP report or TDX quote file against a policy (JSON)", runVerifyReport)
}

// verifyResult is the --json output.
type verifyResult struct {
	Verified bool              `json:"verified"`
	Mode     attest.Mode       `json:"mode"`
	SNP      *attest.SNPClaims `json:"snp,omitempty"`
	TDX      *attest.TDXClaims `json:"tdx,omitempty"`
	Error    string            `json:"error,omitempty"`
	Kind     string            `json:"kind,omitempty"`
	Field    string            `json:"field,omitempty"`
	Expected string            `json:"expected,omitempty"`
	Actual   string            `json:"actual,omitempty"`
}

func runVerifyReport(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("verify-report")
	reportPath := fs.String("report", "", "SNP ATTESTATION_REPORT (optionally followed by its certificate table) or TDX quote")
	certsPath := fs.String("certs", "", "SNP certificate table (GUID table of an extended report), if not appended to the report")
	policyPath := fs.String("policy", "", "policy (JSON: measurements, vcpus, min_tcb, host_data, nonce, mrtd, …)")
	mode := fs.String("mode", string(attest.ModeSim), "trust: sim (the node's simulated root), snp (AMD) or tdx (Intel)")
	simDir := fs.String("sim-dir", "", "sim mode: the state dir of the node's simulated secure processor (holds cert_chain.pem)")
	fetch := fs.Bool("fetch", false, "hardware modes: fetch missing certificates and collateral from AMD KDS / Intel PCS")
	at := fs.String("at", "", "check certificate validity at this time (RFC 3339) instead of now")
	asJSON := fs.Bool("json", false, "print the verified claims (or the failure) as JSON")
	hostNonce := fs.String("host-nonce", "", "hex: the nonce given to the c8s agent's GetEvidence; REPORT_DATA must be its host-attestation binding, SHA-512(\"c8s host attestation\" || 0x00 || nonce) (instead of the policy's nonce, which is REPORT_DATA as it is)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *reportPath == "" || *policyPath == "" {
		return errors.New("--report and --policy are required")
	}
	evidence, err := os.ReadFile(*reportPath)
	if err != nil {
		return err
	}
	policy, err := attest.LoadPolicy(*policyPath)
	if err != nil {
		return err
	}
	if *hostNonce != "" {
		if len(policy.Nonce) != 0 {
			return errors.New("--host-nonce and the policy's nonce both give REPORT_DATA: give one")
		}
		n, err := hex.DecodeString(*hostNonce)
		if err != nil || len(n) == 0 || len(n) > reportdata.MaxNonce {
			return fmt.Errorf("--host-nonce %q: want 1 to %d bytes in hex", *hostNonce, reportdata.MaxNonce)
		}
		rd := reportdata.Host(n)
		policy.Nonce = rd[:]
	}
	trust := attest.Trust{Mode: attest.Mode(*mode), FetchCertificates: *fetch}
	if trust.Mode == attest.ModeSim {
		if *simDir == "" {
			return errors.New("sim mode needs --sim-dir, the node's simulated secure processor state dir")
		}
		if trust, err = attest.SimTrust(*simDir); err != nil {
			return err
		}
	}
	if *at != "" {
		t, err := time.Parse(time.RFC3339, *at)
		if err != nil {
			return fmt.Errorf("--at: %w", err)
		}
		trust.Now = func() time.Time { return t }
	}
	v, err := attest.NewVerifier(trust)
	if err != nil {
		return err
	}

	res := verifyResult{Mode: trust.Mode}
	if trust.Mode == attest.ModeTDX {
		res.TDX, err = v.VerifyTDX(evidence, policy)
	} else {
		report, certs := evidence, []byte(nil)
		if len(report) > abi.ReportSize {
			report, certs = evidence[:abi.ReportSize], evidence[abi.ReportSize:]
		}
		if *certsPath != "" {
			if certs, err = os.ReadFile(*certsPath); err != nil {
				return err
			}
		}
		res.SNP, err = v.VerifySNP(report, certs, policy)
	}
	if !*asJSON {
		if err != nil {
			return err
		}
		printClaims(stdout, &res)
		return nil
	}
	res.Verified = err == nil
	if err != nil {
		res.Error = err.Error()
		var e *attest.Error
		if errors.As(err, &e) {
			res.Kind, res.Field, res.Expected, res.Actual = e.Kind.String(), e.Field, e.Expected, e.Actual
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if jerr := enc.Encode(res); jerr != nil {
		return jerr
	}
	return err
}

func printClaims(w io.Writer, r *verifyResult) {
	if c := r.SNP; c != nil {
		sim := ""
		if c.Simulated {
			sim = " (SIMULATED secure processor, test only)"
		}
		fmt.Fprintf(w, "verified: SEV-SNP report v%d, mode %s%s\n", c.ReportVersion, c.Mode, sim)
		fmt.Fprintf(w, "  vCPUs        %d\n  measurement  %s\n  host_data    %s\n  report_data  %s\n  chip_id      %s\n  reported_tcb %#x\n  guest_policy %#x\n  vmpl         %d\n",
			c.VCPUs, c.Measurement, c.HostData, c.ReportData, c.ChipID, c.ReportedTCB, c.GuestPolicy, c.VMPL)
	}
	if c := r.TDX; c != nil {
		fmt.Fprintf(w, "verified: TDX quote v%d\n  mrtd         %s\n  mrconfigid   %s\n", c.QuoteVersion, c.MRTD, c.MRConfigID)
		for i, m := range c.RTMRs {
			fmt.Fprintf(w, "  rtmr%d        %s\n", i, m)
		}
		fmt.Fprintf(w, "  td_attributes %s\n  report_data  %s\n", c.TDAttributes, c.ReportData)
	}
}
