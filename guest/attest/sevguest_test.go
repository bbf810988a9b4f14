package attest

import (
	"bytes"
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	sevclient "github.com/google/go-sev-guest/client"
	sevtest "github.com/google/go-sev-guest/testing"
	"github.com/google/go-sev-guest/verify"
)

func nonce(b byte) [64]byte {
	var n [64]byte
	for i := range n {
		n[i] = b + byte(i)
	}
	return n
}

// fakeSEVGuest is go-sev-guest's fake sev-guest device with a fake AMD
// secure processor (test-only ARK/ASK/VCEK) that answers for nonce.
func fakeSEVGuest(t *testing.T, n [64]byte) *sevtest.Device {
	t.Helper()
	tcs := []sevtest.TestCase{{Name: "nonce", Input: n, Output: sevtest.TestRawReport(n)}}
	d, err := sevtest.TcDevice(tcs, &sevtest.DeviceOptions{Now: time.Now(), Product: abi.DefaultSevProduct()})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func sevProvider(d *sevtest.Device) *SEVGuest {
	p := NewSEVGuest("/fixture/dev/sev-guest")
	p.open = func(path string) (sevclient.Device, error) {
		if path != "/fixture/dev/sev-guest" {
			return nil, &unexpectedPath{path}
		}
		return d, d.Open(path)
	}
	return p
}

type unexpectedPath struct{ path string }

func (e *unexpectedPath) Error() string { return "unexpected device path " + e.path }

func TestSEVGuestExtendedReport(t *testing.T) {
	n := nonce(7)
	d := fakeSEVGuest(t, n)
	p := sevProvider(d)
	ev, err := p.Evidence(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Kind != KindSNP || ev.Provider != NameSEVGuest || p.Name() != NameSEVGuest {
		t.Errorf("kind %q provider %q name %q", ev.Kind, ev.Provider, p.Name())
	}
	report, err := abi.ReportToProto(ev.Report)
	if err != nil {
		t.Fatalf("the report does not parse: %v", err)
	}
	if !bytes.Equal(report.GetReportData(), n[:]) {
		t.Errorf("REPORT_DATA = %x, want the nonce %x", report.GetReportData(), n)
	}
	if !bytes.Equal(ev.CertTable, d.Certs) {
		t.Fatalf("cert table (%d bytes) is not the device's (%d bytes)", len(ev.CertTable), len(d.Certs))
	}
	// The certificate table carries the VCEK that signed this report.
	var certs abi.CertTable
	if err := certs.Unmarshal(ev.CertTable); err != nil {
		t.Fatal(err)
	}
	der, err := certs.GetByGUIDString(abi.VcekGUID)
	if err != nil {
		t.Fatal(err)
	}
	vcek, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify.SnpReportSignature(ev.Report, vcek); err != nil {
		t.Fatalf("the report's signature does not verify with the table's VCEK: %v", err)
	}
	// The device was closed again (the fake refuses a second Open).
	if err := d.Open(""); err != nil {
		t.Errorf("device left open: %v", err)
	}
}

// A host that supplies no certificates: the provider falls back to a plain
// report, still bound to the nonce.
func TestSEVGuestNoCertificates(t *testing.T) {
	n := nonce(40)
	d := fakeSEVGuest(t, n)
	d.Certs = nil
	ev, err := sevProvider(d).Evidence(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	if len(ev.CertTable) != 0 {
		t.Errorf("cert table of %d bytes from a host without certificates", len(ev.CertTable))
	}
	if got := ev.Report[snpReportDataOffset : snpReportDataOffset+64]; !bytes.Equal(got, n[:]) {
		t.Errorf("REPORT_DATA = %x, want %x", got, n)
	}
}

func TestSEVGuestErrors(t *testing.T) {
	n := nonce(1)
	// The device answers only for another nonce.
	_, err := sevProvider(fakeSEVGuest(t, nonce(2))).Evidence(context.Background(), n)
	if err == nil || !strings.Contains(err.Error(), "/fixture/dev/sev-guest") {
		t.Errorf("unanswered request: err = %v, want an error naming the device", err)
	}
	// The device answers with a report for another request.
	d := fakeSEVGuest(t, n)
	d.ReportDataRsp[hexOf(n)].(*sevtest.GetReportResponse).Resp.Data = sevtest.TestRawReport(nonce(3))
	_, err = sevProvider(d).Evidence(context.Background(), n)
	if err == nil || !strings.Contains(err.Error(), "REPORT_DATA") {
		t.Errorf("report for another nonce: err = %v, want a REPORT_DATA mismatch", err)
	}
	// No device.
	_, err = NewSEVGuest(t.TempDir()+"/sev-guest").Evidence(context.Background(), n)
	if err == nil || !strings.Contains(err.Error(), "sev-guest") {
		t.Errorf("missing device: err = %v", err)
	}
}
