package attest

import (
	"bytes"
	"context"
	"strings"
	"testing"

	tdxabi "github.com/google/go-tdx-guest/abi"
	tdxclient "github.com/google/go-tdx-guest/client"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	tdxtest "github.com/google/go-tdx-guest/testing"
	"github.com/google/go-tdx-guest/testing/testdata"
)

func quoteReportData(t *testing.T, quote []byte) []byte {
	t.Helper()
	q, err := tdxabi.QuoteToProto(quote)
	if err != nil {
		t.Fatalf("the quote does not parse: %v", err)
	}
	v4, ok := q.(*tdxpb.QuoteV4)
	if !ok {
		t.Fatalf("quote is a %T, want a v4 quote", q)
	}
	return v4.GetTdQuoteBody().GetReportData()
}

// sampleQuoteFor is go-tdx-guest's sample quote with n in its REPORT_DATA,
// as a TD whose report carried n would get it.
func sampleQuoteFor(t *testing.T, n [64]byte) []byte {
	t.Helper()
	quote := bytes.Clone(testdata.RawQuote)
	old := quoteReportData(t, quote)
	at := bytes.Index(quote, old)
	if at < 0 || bytes.Count(quote, old) != 1 {
		t.Fatalf("cannot place REPORT_DATA in the sample quote")
	}
	copy(quote[at:], n[:])
	return quote
}

// tdReportFor is go-tdx-guest's sample TDREPORT with n in its
// REPORTDATA, as the TDX module answers a request for n.
func tdReportFor(n [64]byte) []byte {
	r := bytes.Clone(testdata.RawReport[:TDReportSize])
	copy(r[tdReportDataOffset:], n[:])
	return r
}

// fakeTDXGuest is go-tdx-guest's fake tdx-guest device, answering the
// nonce with a TDREPORT and that report with a quote.
func fakeTDXGuest(t *testing.T, n [64]byte, quote []byte) *tdxtest.Device {
	t.Helper()
	return fakeTDXGuestReport(t, n, tdReportFor(n), quote)
}

// fakeTDXGuestReport is fakeTDXGuest answering n with report.
func fakeTDXGuestReport(t *testing.T, n [64]byte, report, quote []byte) *tdxtest.Device {
	t.Helper()
	tc := tdxtest.TestCase{Name: "nonce", Input: n, Quote: quote}
	copy(tc.Report[:], report)
	d, err := tdxtest.TcDevice([]tdxtest.TestCase{tc})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func tdxProvider(d *tdxtest.Device) *TDXGuest {
	p := NewTDXGuest("/fixture/dev/tdx_guest")
	p.open = func(path string) (tdxclient.Device, error) {
		if path != "/fixture/dev/tdx_guest" {
			return nil, &unexpectedPath{path}
		}
		return d, d.Open(path)
	}
	return p
}

func TestTDXGuestQuote(t *testing.T) {
	n := nonce(9)
	want := sampleQuoteFor(t, n)
	d := fakeTDXGuest(t, n, want)
	p := tdxProvider(d)
	ev, err := p.Evidence(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Kind != KindTDX || ev.Provider != NameTDXGuest || p.Name() != NameTDXGuest || len(ev.CertTable) != 0 {
		t.Errorf("kind %q provider %q name %q certs %d", ev.Kind, ev.Provider, p.Name(), len(ev.CertTable))
	}
	if !bytes.Equal(ev.Report, want) {
		t.Fatalf("quote (%d bytes) is not the device's (%d bytes)", len(ev.Report), len(want))
	}
	if got := quoteReportData(t, ev.Report); !bytes.Equal(got, n[:]) {
		t.Errorf("REPORT_DATA = %x, want the nonce %x", got, n)
	}
	// The TDREPORT the guest read itself comes with the quote: the agent
	// takes MRCONFIGID from it, not from the host-relayed quote.
	if !bytes.Equal(ev.TDReport, tdReportFor(n)) {
		t.Errorf("TDREPORT (%d bytes) is not the TDX module's", len(ev.TDReport))
	}
	if err := d.Open(""); err != nil {
		t.Errorf("device left open: %v", err)
	}
}

// configfs-tsm returns only the quote; the TDREPORT is read through the
// tdx-guest device beside it.
func TestTDReportBesideAnotherProvider(t *testing.T) {
	n := nonce(5)
	quote := sampleQuoteFor(t, n)
	d := fakeTDXGuest(t, n, quote)
	w := withTDReport{Provider: quoteOnly{quote}, tdx: tdxProvider(d)}
	ev, err := w.Evidence(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ev.Report, quote) || !bytes.Equal(ev.TDReport, tdReportFor(n)) {
		t.Fatalf("evidence: quote %d bytes, TDREPORT %d bytes; want the provider's quote and the device's TDREPORT", len(ev.Report), len(ev.TDReport))
	}
	if _, err := w.Evidence(context.Background(), nonce(6)); err == nil {
		t.Fatal("a TDREPORT for other report data than the device answers: no error")
	}
}

// A TDREPORT that does not carry the requested REPORTDATA (the sample's
// own, as a stale or substituted report would) is not evidence for this
// request, whichever way the guest read it.
func TestTDReportForAnotherRequest(t *testing.T) {
	n := nonce(7)
	quote := sampleQuoteFor(t, n)
	stale := bytes.Clone(testdata.RawReport[:TDReportSize])
	if _, err := tdxProvider(fakeTDXGuestReport(t, n, stale, quote)).Evidence(context.Background(), n); err == nil || !strings.Contains(err.Error(), "REPORTDATA") {
		t.Errorf("quote and TDREPORT through tdx-guest: err = %v, want the TDREPORT's REPORTDATA named", err)
	}
	w := withTDReport{Provider: quoteOnly{quote}, tdx: tdxProvider(fakeTDXGuestReport(t, n, stale, quote))}
	if _, err := w.Evidence(context.Background(), n); err == nil || !strings.Contains(err.Error(), "REPORTDATA") {
		t.Errorf("TDREPORT beside configfs-tsm: err = %v, want the TDREPORT's REPORTDATA named", err)
	}
	if err := checkTDReport(make([]byte, 16), n); err == nil {
		t.Error("a 16-byte TDREPORT passed")
	}
}

// quoteOnly is a provider of TDX quotes without TDREPORT, as configfs-tsm.
type quoteOnly struct{ quote []byte }

func (quoteOnly) Name() string { return NameConfigfsTSM }
func (q quoteOnly) Evidence(context.Context, [64]byte) (*Evidence, error) {
	return &Evidence{Kind: KindTDX, Provider: NameConfigfsTSM, Report: q.quote}, nil
}

func TestTDXGuestErrors(t *testing.T) {
	n := nonce(3)
	// The device has no report for this nonce.
	d := fakeTDXGuest(t, nonce(4), sampleQuoteFor(t, nonce(4)))
	_, err := tdxProvider(d).Evidence(context.Background(), n)
	if err == nil || !strings.Contains(err.Error(), "/fixture/dev/tdx_guest") {
		t.Errorf("unanswered request: err = %v, want an error naming the device", err)
	}
	_, err = NewTDXGuest(t.TempDir()+"/tdx_guest").Evidence(context.Background(), n)
	if err == nil || !strings.Contains(err.Error(), "tdx_guest") {
		t.Errorf("missing device: err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tdxProvider(fakeTDXGuest(t, n, sampleQuoteFor(t, n))).Evidence(ctx, n); err == nil {
		t.Error("a cancelled context still produced evidence")
	}
}
