package attest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	sevtestdata "github.com/google/go-sev-guest/verify/testdata"
)

// A real AMD attestation (go-sev-guest's verify/testdata: a Milan report and
// the VCEK AMD's KDS issued for its chip and TCB).
func realSNP(t *testing.T) (report, table []byte, p *Policy) {
	t.Helper()
	r, err := abi.ReportToProto(sevtestdata.AttestationBytes)
	if err != nil {
		t.Fatal(err)
	}
	table = abi.CertsFromProto(&spb.CertificateChain{VcekCert: sevtestdata.VcekBytes}).Marshal()
	vcpus := 1
	return sevtestdata.AttestationBytes, table, &Policy{
		Measurements: map[int]Hex{vcpus: r.GetMeasurement()},
		VCPUs:        vcpus,
		Nonce:        r.GetReportData(),
		AllowDebug:   r.GetPolicy()&snpPolicyDebug != 0,
		// The 2022 report is below c8s's default Milan minimum.
		MinTCB: r.GetReportedTcb(),
	}
}

// When that VCEK was valid (go-sev-guest's tests use this date).
var realSNPTime = func() time.Time { return time.Date(2022, time.September, 24, 1, 0, 0, 0, time.UTC) }

func TestRealAMDReportInHardwareMode(t *testing.T) {
	report, table, p := realSNP(t)
	v, err := NewVerifier(Trust{Mode: ModeSNP, Now: realSNPTime})
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.VerifySNP(report, table, p)
	if err != nil {
		t.Fatalf("a real AMD report with its KDS VCEK, against AMD's roots: %v", err)
	}
	if c.Simulated || c.Mode != ModeSNP {
		t.Errorf("claims %+v", c)
	}
	t.Logf("verified: version %d, measurement %s, TCB %#x", c.ReportVersion, c.Measurement, c.ReportedTCB)

	// The same report, altered, is refused by AMD's chain too.
	bad := append([]byte(nil), report...)
	bad[0x90] ^= 1
	if _, err := v.VerifySNP(bad, table, p); err == nil || !strings.Contains(err.Error(), "report signature") {
		t.Errorf("an altered AMD report: %v", err)
	}
}

func TestRealAMDReportRefusedInSimMode(t *testing.T) {
	report, table, p := realSNP(t)
	this, _ := nodes(t)
	v, err := NewVerifier(Trust{Mode: ModeSim, SimCertChain: this.CertChainPEM(), Now: realSNPTime})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.VerifySNP(report, table, p)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindRoot || !strings.Contains(err.Error(), "not from a c8s simulated secure processor") {
		t.Fatalf("a real AMD report in sim mode: %v, want a root error", err)
	}
}
