package attest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-configfs-tsm/configfs/configfsi"
	"github.com/google/go-configfs-tsm/configfs/faketsm"
	"github.com/google/go-sev-guest/abi"
	sevtest "github.com/google/go-sev-guest/testing"
)

// fakeTSM is go-configfs-tsm's fake configfs whose report provider answers
// like the kernel driver called provider: sev_guest fills an SNP report
// from inblob and has an auxblob (certs), tdx_guest returns quote and has
// no auxblob (the kernel hides it); anything else answers as the stock
// fake. It counts auxblob reads and the report entries left behind.
type tsmFixture struct {
	client   *faketsm.Client
	sub      *faketsm.ReportSubsystem
	auxReads int
}

func fakeTSM(provider string, certs, quote []byte) *tsmFixture {
	f := &tsmFixture{sub: faketsm.ReportV7(0)}
	stock := f.sub.ReadAttr
	f.sub.ReadAttr = func(e *faketsm.ReportEntry, attr string) ([]byte, error) {
		switch {
		case attr == "provider" && provider != "":
			return []byte(provider + "\n"), nil
		case attr == "auxblob" && provider == "sev_guest":
			f.auxReads++
			return certs, nil
		case attr == "auxblob" && provider == "tdx_guest":
			f.auxReads++
			return nil, os.ErrNotExist
		case attr == "outblob" && provider == "tdx_guest":
			return quote, nil
		case attr == "outblob" && provider == "sev_guest":
			var n [64]byte
			copy(n[:], e.InAttrs["inblob"].Value)
			r := sevtest.TestRawReport(n)
			return r[:abi.ReportSize], nil
		}
		return stock(e, attr)
	}
	f.client = &faketsm.Client{Subsystems: map[string]configfsi.Client{"report": f.sub}}
	return f
}

func TestConfigfsTSMSNP(t *testing.T) {
	certs := []byte("certificate table")
	f := fakeTSM("sev_guest", certs, nil)
	p := NewConfigfsTSM(f.client)
	n := nonce(11)
	ev, err := p.Evidence(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Kind != KindSNP || ev.Provider != NameConfigfsTSM || p.Name() != NameConfigfsTSM {
		t.Errorf("kind %q provider %q name %q", ev.Kind, ev.Provider, p.Name())
	}
	r, err := abi.ReportToProto(ev.Report)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.GetReportData(), n[:]) {
		t.Errorf("REPORT_DATA = %x, want the nonce %x", r.GetReportData(), n)
	}
	if !bytes.Equal(ev.CertTable, certs) {
		t.Errorf("cert table = %q, want the auxblob %q", ev.CertTable, certs)
	}
	if len(f.sub.Entries) != 0 {
		t.Errorf("%d report entries left in configfs", len(f.sub.Entries))
	}
}

func TestConfigfsTSMTDX(t *testing.T) {
	n := nonce(12)
	quote := sampleQuoteFor(t, n)
	f := fakeTSM("tdx_guest", nil, quote)
	ev, err := NewConfigfsTSM(f.client).Evidence(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Kind != KindTDX || !bytes.Equal(ev.Report, quote) || len(ev.CertTable) != 0 {
		t.Fatalf("kind %q, %d-byte report, %d-byte certs", ev.Kind, len(ev.Report), len(ev.CertTable))
	}
	if got := quoteReportData(t, ev.Report); !bytes.Equal(got, n[:]) {
		t.Errorf("REPORT_DATA = %x, want %x", got, n)
	}
	if f.auxReads != 0 {
		t.Errorf("read the auxblob of a TDX report %d times", f.auxReads)
	}
	if len(f.sub.Entries) != 0 {
		t.Errorf("%d report entries left in configfs", len(f.sub.Entries))
	}
}

// A provider c8s does not know (the stock fake's "fake") is refused by
// name, and the report entry is still removed.
func TestConfigfsTSMUnknownProvider(t *testing.T) {
	f := fakeTSM("", nil, nil)
	_, err := NewConfigfsTSM(f.client).Evidence(context.Background(), nonce(13))
	if err == nil || !strings.Contains(err.Error(), `unknown provider "fake"`) {
		t.Fatalf("err = %v, want the unknown provider named", err)
	}
	if len(f.sub.Entries) != 0 {
		t.Errorf("%d report entries left in configfs after a failure", len(f.sub.Entries))
	}
}

// A configfs-tsm provider that Detect made for the TEE the VM was started
// as returns only that TEE's evidence: a TDX quote in a guest started as
// snp is refused, and one in a guest started as tdx is returned.
func TestConfigfsTSMOnlyTheNamedKind(t *testing.T) {
	n := nonce(14)
	f := fakeTSM("tdx_guest", nil, sampleQuoteFor(t, n))
	snp := NewConfigfsTSM(f.client)
	snp.kind = KindSNP
	if _, err := snp.Evidence(context.Background(), n); err == nil || !strings.Contains(err.Error(), "started as snp") {
		t.Fatalf("TDX quote in a guest started as snp: %v, want refused", err)
	}
	if len(f.sub.Entries) != 0 {
		t.Errorf("%d report entries left in configfs after a refusal", len(f.sub.Entries))
	}
	tdx := NewConfigfsTSM(f.client)
	tdx.kind = KindTDX
	if ev, err := tdx.Evidence(context.Background(), n); err != nil || ev.Kind != KindTDX {
		t.Fatalf("TDX quote in a guest started as tdx: %v, %v", ev, err)
	}
}

// The kernel's paths map below another root, and come back unrooted, as
// go-configfs-tsm's report package parses them.
func TestRootedClient(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, TSMReportDir), 0o755); err != nil {
		t.Fatal(err)
	}
	c := rootedClient{root: root}
	entry, err := c.MkdirTemp(TSMReportDir, "entry")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(entry) != TSMReportDir {
		t.Fatalf("entry %q is not in %s", entry, TSMReportDir)
	}
	if _, err := os.Stat(filepath.Join(root, entry)); err != nil {
		t.Fatalf("entry not created below the root: %v", err)
	}
	des, err := c.ReadDir(TSMReportDir)
	if err != nil || len(des) != 1 || des[0].Name() != filepath.Base(entry) {
		t.Fatalf("ReadDir = %v, %v", des, err)
	}
	attr := filepath.Join(entry, "inblob")
	if err := c.WriteFile(attr, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, attr), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadFile(attr); err != nil || string(got) != "x" {
		t.Fatalf("ReadFile = %q, %v", got, err)
	}
	if err := c.RemoveAll(entry); err == nil {
		t.Fatal("removed a non-empty plain directory: configfs entries are removed with rmdir, nothing recursive")
	}
	if err := os.Remove(filepath.Join(root, attr)); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveAll(entry); err != nil {
		t.Fatal(err)
	}
}
