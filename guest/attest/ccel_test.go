package attest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

type fixedProvider struct{ ev Evidence }

func (fixedProvider) Name() string { return "fixed" }
func (f fixedProvider) Evidence(context.Context, [64]byte) (*Evidence, error) {
	ev := f.ev
	return &ev, nil
}

// TDX evidence carries the CCEL table's data as it is; SNP evidence and a
// guest without the table carry none.
func TestCCELAddedToTDXEvidence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "CCEL")
	log := append([]byte("a CC event log"), bytes.Repeat([]byte{0xff}, 100)...)
	if err := os.WriteFile(path, log, 0o444); err != nil {
		t.Fatal(err)
	}
	tdx := withCCEL{Provider: fixedProvider{Evidence{Kind: KindTDX, Report: []byte("quote")}}, path: path}
	ev, err := tdx.Evidence(context.Background(), [64]byte{})
	if err != nil || !bytes.Equal(ev.EventLog, log) {
		t.Fatalf("TDX evidence: %q, %v", ev.EventLog, err)
	}
	snp := withCCEL{Provider: fixedProvider{Evidence{Kind: KindSNP}}, path: path}
	if ev, err := snp.Evidence(context.Background(), [64]byte{}); err != nil || ev.EventLog != nil {
		t.Fatalf("SNP evidence: %q, %v", ev.EventLog, err)
	}
	none := withCCEL{Provider: tdx.Provider, path: filepath.Join(dir, "absent")}
	if ev, err := none.Evidence(context.Background(), [64]byte{}); err != nil || ev.EventLog != nil {
		t.Fatalf("no CCEL: %q, %v", ev.EventLog, err)
	}
}
