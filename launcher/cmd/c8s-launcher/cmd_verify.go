package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
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
	fetch := fs.Bool("fetch", false, "hardware modes: fetch missing certificates and collateral from AMD KDS / Intel PCS (fails at once, kind network, without a network)")
	eventLogPath := fs.String("event-log", "", "tdx: the TD's CC event log (CCEL table data), replayed to the quote's RTMRs and checked against the policy's tdx_boot; sim: the simulated boot's log")
	collateralDir := fs.String("collateral", "", "tdx: a directory of Intel collateral (c8s-launcher collateral fetch): TCB status, QE identity and PCK revocation are checked offline; snp: its AMD CRLs (amd_crl_<product>[_vlek].der) are checked")
	simRTMRsPath := fs.String("sim-rtmrs", "", "sim: the RTMR statement of the simulated secure processor (with --event-log, for a policy with tdx_boot)")
	allowProvisional := fs.Bool("allow-provisional-firmware", false, "snp: accept firmware the host has not committed to (COMMITTED_TCB or REPORTED_TCB below CURRENT_TCB, as on many cloud hosts); sets the policy's allow_provisional_firmware")
	minTCB := fs.String("min-tcb", "", "snp: the minimum REPORTED_TCB, a TCB_VERSION in the report's product-line layout (0x… or decimal); replaces the policy's min_tcb and c8s's per-product default (0 accepts any TCB)")
	vmpl := fs.Int("vmpl", -1, "snp: the VMPL the report must have been requested at (0-3); replaces the policy's vmpl (default 0, what c8s guests use)")
	var amdCRLs stringList
	fs.Var(&amdCRLs, "amd-crl", "snp: an AMD CRL `FILE` (DER or PEM, as the KDS serves vcek/v1/<product>/crl and vlek/v1/<product>/crl; repeatable): a report whose ASK or ASVK it revokes is refused (offline revocation)")
	fetchTimeout := fs.Duration("fetch-timeout", attest.DefaultFetchTimeout, "with --fetch: the time each fetch may take; fetches are not retried")
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
	if *allowProvisional {
		policy.AllowProvisionalFirmware = true
	}
	if *minTCB != "" {
		v, err := strconv.ParseUint(*minTCB, 0, 64)
		if err != nil {
			return fmt.Errorf("--min-tcb %q: want a TCB_VERSION, 0x… or decimal", *minTCB)
		}
		policy.MinTCB, policy.MinTCBExplicit = v, true
	}
	if *vmpl >= 0 {
		policy.VMPL = vmpl
	}
	trust := attest.Trust{Mode: attest.Mode(*mode), FetchCertificates: *fetch, FetchTimeout: *fetchTimeout}
	for _, f := range amdCRLs {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		trust.AMDCRLs = append(trust.AMDCRLs, b)
	}
	if trust.Mode == attest.ModeSim {
		if *simDir == "" {
			return errors.New("sim mode needs --sim-dir, the node's simulated secure processor state dir")
		}
		if trust, err = attest.SimTrust(*simDir); err != nil {
			return err
		}
	}
	if *collateralDir != "" {
		if trust.Mode == attest.ModeSim {
			return errors.New("--collateral is hardware collateral: use it with --mode tdx or snp")
		}
		if err := trust.LoadCollateral(*collateralDir); err != nil {
			return fmt.Errorf("--collateral: %w", err)
		}
	}
	var eventLog, simRTMRs []byte
	if *eventLogPath != "" {
		if eventLog, err = os.ReadFile(*eventLogPath); err != nil {
			return err
		}
	}
	if *simRTMRsPath != "" {
		if simRTMRs, err = os.ReadFile(*simRTMRsPath); err != nil {
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
	ev := verdict.Evidence{Kind: "tdx", Report: evidence, EventLog: eventLog}
	if trust.Mode != attest.ModeTDX {
		report, certs := evidence, []byte(nil)
		if len(report) > abi.ReportSize {
			report, certs = evidence[:abi.ReportSize], evidence[abi.ReportSize:]
		}
		if *certsPath != "" {
			if certs, err = os.ReadFile(*certsPath); err != nil {
				return err
			}
		}
		ev = verdict.Evidence{Kind: "snp", Report: report, CertTable: certs, SimRTMRs: simRTMRs, EventLog: eventLog}
	}
	// The same verification as the shim's (c8s-verify, attest.Decide).
	res.SNP, res.TDX, err = v.VerifyEvidence(ev, policy)
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
		prov := ""
		if c.Provisional {
			prov = " (provisional firmware, allowed by the policy)"
		}
		fmt.Fprintf(w, "  product      %s, signed by its %s\n  tcb          %s%s\n", c.ProductLine, c.SigningKey, c.TCB, prov)
		fmt.Fprintf(w, "  vCPUs        %d\n  measurement  %s\n  host_data    %s\n  report_data  %s\n  chip_id      %s\n  reported_tcb %#x\n  guest_policy %#x\n  vmpl         %d\n",
			c.VCPUs, c.Measurement, c.HostData, c.ReportData, c.ChipID, c.ReportedTCB, c.GuestPolicy, c.VMPL)
	}
	if c := r.TDX; c != nil {
		fmt.Fprintf(w, "verified: TDX quote v%d\n  mrtd         %s\n  mrconfigid   %s\n", c.QuoteVersion, c.MRTD, c.MRConfigID)
		for i, m := range c.RTMRs {
			fmt.Fprintf(w, "  rtmr%d        %s\n", i, m)
		}
		fmt.Fprintf(w, "  td_attributes %s\n  tee_tcb_svn  %s\n  report_data  %s\n  event_log    %s\n", c.TDAttributes, c.TeeTCBSVN, c.ReportData,
			map[bool]string{true: "replayed to the RTMRs", false: "none"}[c.EventLogReplayed])
		if t := c.TCB; t != nil {
			fmt.Fprintf(w, "  tcb_status   %s (module %s, QE %s; FMSPC %s, TCB date %s, evaluation %d)\n", t.Status, t.ModuleStatus, t.QEStatus, t.FMSPC, t.TCBDate, t.EvaluationDataNumber)
		} else {
			fmt.Fprintf(w, "  tcb_status   not checked (no --collateral, no --fetch)\n")
		}
	}
}
