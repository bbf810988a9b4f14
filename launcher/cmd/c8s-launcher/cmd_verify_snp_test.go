package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
)

// snpSampleFiles writes a genuine sample (launcher/attest/testdata/snp)
// as verify-report reads it: the report with its certificate table
// appended (or not), and a policy derived from the report.
func snpSampleFiles(t *testing.T, sample, keyFile string, withTable bool) (report, policy string) {
	t.Helper()
	dir := filepath.Join("..", "..", "attest", "testdata", "snp", sample)
	raw, err := os.ReadFile(filepath.Join(dir, "report.bin"))
	if err != nil {
		t.Fatal(err)
	}
	der, err := os.ReadFile(filepath.Join(dir, keyFile))
	if err != nil {
		t.Fatal(err)
	}
	r, err := abi.ReportToProto(raw)
	if err != nil {
		t.Fatal(err)
	}
	chain := &spb.CertificateChain{VcekCert: der}
	if keyFile == "vlek.der" {
		chain = &spb.CertificateChain{VlekCert: der}
	}
	out := t.TempDir()
	report = filepath.Join(out, "report.bin")
	ev := raw
	if withTable {
		ev = append(append([]byte(nil), raw...), abi.CertsFromProto(chain).Marshal()...)
	}
	if err := os.WriteFile(report, ev, 0o644); err != nil {
		t.Fatal(err)
	}
	policy = filepath.Join(out, "policy.json")
	doc := fmt.Sprintf(`{"measurements": {"1": %q}, "vcpus": 1, "nonce": %q}`, hex.EncodeToString(r.GetMeasurement()), hex.EncodeToString(r.GetReportData()))
	if err := os.WriteFile(policy, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return report, policy
}

// verify-report on genuine AMD evidence: Turin, and an AWS VLEK report of
// provisional firmware at VMPL 1 that needs the flags for both.
func TestVerifyReportGenuineSNP(t *testing.T) {
	report, policy := snpSampleFiles(t, "turin-v5-oak", "vcek.der", true)
	out, err := runVerify(t, "--mode", "snp", "--report", report, "--policy", policy, "--at", "2025-08-01T00:00:00Z")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "product      Turin, signed by its VCEK") || !strings.Contains(out, "tcb          fmc=0 bl=1 tee=0 snp=2 ucode=71") {
		t.Errorf("output:\n%s", out)
	}
	if _, err := runVerify(t, "--mode", "snp", "--report", report, "--policy", policy, "--at", "2025-08-01T00:00:00Z", "--min-tcb", "0x4700000003000100"); err == nil || !strings.Contains(err.Error(), "snp 2 < 3") {
		t.Errorf("--min-tcb above the report's: %v", err)
	}

	report, policy = snpSampleFiles(t, "milan-vlek-aws", "vlek.der", true)
	at := "2025-01-01T00:00:00Z"
	_, err = runVerify(t, "--mode", "snp", "--report", report, "--policy", policy, "--at", at)
	if err == nil || !strings.Contains(err.Error(), "VMPL mismatch: expected 0, got 1") {
		t.Fatalf("VMPL 1 without --vmpl: %v", err)
	}
	_, err = runVerify(t, "--mode", "snp", "--report", report, "--policy", policy, "--at", at, "--vmpl", "1")
	if err == nil || !strings.Contains(err.Error(), "allow_provisional_firmware") {
		t.Fatalf("provisional firmware without --allow-provisional-firmware: %v", err)
	}
	out, err = runVerify(t, "--mode", "snp", "--report", report, "--policy", policy, "--at", at, "--vmpl", "1", "--allow-provisional-firmware")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "product      Milan, signed by its VLEK") || !strings.Contains(out, "provisional firmware") {
		t.Errorf("output:\n%s", out)
	}
	if _, err := runVerify(t, "--mode", "snp", "--report", report, "--policy", policy, "--amd-crl", policy); err == nil || !strings.Contains(err.Error(), "AMD CRL") {
		t.Errorf("a policy file as CRL: %v", err)
	}
}

// --fetch on a host without a network fails within seconds, as a network
// error (a proxy that refuses stands for the missing network).
func TestVerifyReportFetchFailsFast(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	t.Setenv("HTTPS_PROXY", "http://"+addr)
	report, policy := snpSampleFiles(t, "milan-v3-oak", "vcek.der", false)
	start := time.Now()
	out, err := runVerify(t, "--mode", "snp", "--report", report, "--policy", policy, "--fetch", "--json", "--at", "2025-02-01T00:00:00Z")
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v", d)
	}
	var res verifyResult
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil {
		t.Fatalf("%v: %s", jerr, out)
	}
	if err == nil || res.Verified || res.Kind != "network" || !strings.Contains(res.Field, "AMD's KDS") {
		t.Fatalf("kind %q field %q: %v", res.Kind, res.Field, err)
	}
}

func runVerify(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := tool.Run(context.Background(), "verify-report", args, &out)
	return out.String(), err
}
