package attest

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// Trust.LoadCollateral loads Intel's files in tdx mode, refuses a
// directory with nothing for the mode, and a missing one, saying how to
// make it.
func TestTrustLoadCollateral(t *testing.T) {
	tdx := Trust{Mode: ModeTDX}
	if err := tdx.LoadCollateral(collB0C06F); err != nil || tdx.TDXCollateral == nil {
		t.Fatalf("tdx: %v", err)
	}
	snp := Trust{Mode: ModeSNP}
	err := snp.LoadCollateral(collB0C06F)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindConfig || !strings.Contains(err.Error(), "no AMD CRL") || !strings.Contains(err.Error(), "collateral fetch") {
		t.Fatalf("snp with Intel's files only: %v", err)
	}
	for _, tr := range []Trust{{Mode: ModeTDX}, {Mode: ModeSNP}} {
		err := tr.LoadCollateral(filepath.Join(t.TempDir(), "absent"))
		if !errors.As(err, &e) || e.Kind != KindConfig || !strings.Contains(err.Error(), "c8s-launcher collateral fetch") {
			t.Fatalf("%s, missing directory: %v", tr.Mode, err)
		}
	}
	sim := Trust{Mode: ModeSim}
	if err := sim.LoadCollateral(collB0C06F); err == nil {
		t.Fatal("sim mode took hardware collateral")
	}
}
