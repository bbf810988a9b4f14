package main

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-tdx-guest/testing/testdata"

	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

func TestVerifyReportCommand(t *testing.T) {
	dir := t.TempDir()
	simDir := filepath.Join(dir, "simsp")
	sp, err := sim.Open(simDir)
	if err != nil {
		t.Fatal(err)
	}
	req := sim.Request{Measurement: sha512.Sum384([]byte("launch"))}
	copy(req.ReportData[:], "nonce-1")
	raw, err := sp.Report(req)
	if err != nil {
		t.Fatal(err)
	}
	reportPath := filepath.Join(dir, "report.bin")
	if err := os.WriteFile(reportPath, append(raw, sp.CertTable()...), 0o644); err != nil {
		t.Fatal(err)
	}
	writePolicy := func(measurement string) string {
		p := filepath.Join(dir, "policy.json")
		doc := `{"measurements": {"2": "` + measurement + `"}, "vcpus": 2, "nonce": "` + hex.EncodeToString([]byte("nonce-1")) + `"}`
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := hex.EncodeToString(req.Measurement[:])
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := tool.Run(context.Background(), "verify-report", args, &out)
		return out.String(), err
	}

	out, err := run("--report", reportPath, "--policy", writePolicy(good), "--sim-dir", simDir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "SIMULATED") || !strings.Contains(out, "measurement  "+good) || !strings.Contains(out, "vCPUs        2") {
		t.Errorf("output:\n%s", out)
	}

	out, err = run("--report", reportPath, "--policy", writePolicy(good), "--sim-dir", simDir, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res verifyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if !res.Verified || res.SNP == nil || res.SNP.Measurement.String() != good || !res.SNP.Simulated {
		t.Errorf("JSON result %+v", res)
	}

	bad := strings.Repeat("3f", 48)
	out, err = run("--report", reportPath, "--policy", writePolicy(bad), "--sim-dir", simDir, "--json")
	if err == nil || !strings.Contains(err.Error(), "measurement mismatch: expected "+bad+", got "+good) {
		t.Fatalf("a wrong measurement: %v", err)
	}
	res = verifyResult{}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if res.Verified || res.Kind != "mismatch" || res.Field != "measurement" || res.Expected != bad || res.Actual != good {
		t.Errorf("JSON failure %+v", res)
	}

	// A simulated report is refused by a hardware-mode verifier.
	if _, err := run("--report", reportPath, "--policy", writePolicy(good), "--mode", "snp"); err == nil || !strings.Contains(err.Error(), "SIMULATED") {
		t.Errorf("sim report in snp mode: %v", err)
	}
	if _, err := run("--report", reportPath, "--policy", writePolicy(good)); err == nil || !strings.Contains(err.Error(), "--sim-dir") {
		t.Errorf("sim mode without --sim-dir: %v", err)
	}
}

// --host-nonce checks REPORT_DATA against the host-attestation binding of
// the nonce given to the agent's GetEvidence, as the shim does.
func TestVerifyReportHostNonce(t *testing.T) {
	dir := t.TempDir()
	simDir := filepath.Join(dir, "simsp")
	sp, err := sim.Open(simDir)
	if err != nil {
		t.Fatal(err)
	}
	nonce := []byte("host nonce")
	req := sim.Request{Measurement: sha512.Sum384([]byte("launch")), ReportData: reportdata.Host(nonce)}
	raw, err := sp.Report(req)
	if err != nil {
		t.Fatal(err)
	}
	reportPath := filepath.Join(dir, "report.bin")
	if err := os.WriteFile(reportPath, append(raw, sp.CertTable()...), 0o644); err != nil {
		t.Fatal(err)
	}
	policy := func(extra string) string {
		p := filepath.Join(dir, "policy.json")
		doc := `{"measurements": {"1": "` + hex.EncodeToString(req.Measurement[:]) + `"}` + extra + `}`
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(args ...string) error {
		return tool.Run(context.Background(), "verify-report", args, io.Discard)
	}
	if err := run("--report", reportPath, "--policy", policy(""), "--sim-dir", simDir, "--host-nonce", hex.EncodeToString(nonce)); err != nil {
		t.Fatalf("the agent's binding of the nonce: %v", err)
	}
	// The bare nonce as REPORT_DATA is not what the agent signs.
	if err := run("--report", reportPath, "--policy", policy(`, "nonce": "`+hex.EncodeToString(nonce)+`"`), "--sim-dir", simDir); err == nil || !strings.Contains(err.Error(), "REPORT_DATA") {
		t.Fatalf("the bare nonce: %v, want a report_data mismatch", err)
	}
	if err := run("--report", reportPath, "--policy", policy(""), "--sim-dir", simDir, "--host-nonce", hex.EncodeToString([]byte("other"))); err == nil || !strings.Contains(err.Error(), "REPORT_DATA") {
		t.Fatalf("another nonce: %v, want a report_data mismatch", err)
	}
	if err := run("--report", reportPath, "--policy", policy(`, "nonce": "00"`), "--sim-dir", simDir, "--host-nonce", "01"); err == nil || !strings.Contains(err.Error(), "give one") {
		t.Fatalf("both nonces: %v", err)
	}
}

func TestVerifyReportCommandTDX(t *testing.T) {
	dir := t.TempDir()
	quote := filepath.Join(dir, "quote.dat")
	if err := os.WriteFile(quote, testdata.RawQuote, 0o644); err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(dir, "policy.json")
	rd := hex.EncodeToString(testdata.RawQuote[48+520 : 48+520+64])
	doc := `{"mrtd": "6363b8043668a3ad953278e10389574d326c6749fb78aa810ecd9336923db86f22fc00b8dcd404bc10d5e119d7215cbb", "nonce": "` + rd + `"}`
	if err := os.WriteFile(policy, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tool.Run(context.Background(), "verify-report", []string{"--mode", "tdx", "--report", quote, "--policy", policy, "--at", "2023-07-01T00:00:00Z"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "verified: TDX quote v4") {
		t.Errorf("output:\n%s", out.String())
	}
	// Its PCK certificate was not yet valid in 2010.
	err := tool.Run(context.Background(), "verify-report", []string{"--mode", "tdx", "--report", quote, "--policy", policy, "--at", "2010-01-01T00:00:00Z"}, &out)
	if err == nil || !strings.Contains(err.Error(), "TDX quote signature") {
		t.Errorf("quote checked at a time its certificates were not valid: %v", err)
	}
}
