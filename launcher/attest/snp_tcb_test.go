package attest

import (
	"crypto/x509"
	"encoding/binary"
	"math/big"
	"testing"
	"time"

	"github.com/google/go-sev-guest/kds"

	"github.com/c8s-dev/c8s/launcher/attest/fakecvm"
	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

// A guest launched under SEV firmware or microcode below the minimum,
// the firmware updated live since (SNP_DOWNLOAD_FIRMWARE_EX, late-loaded
// microcode): REPORTED, CURRENT and COMMITTED_TCB meet the minimum, and
// the certificate matches them; only LAUNCH_TCB tells. Refused.
func TestMaliciousHostLaunchTCBBelowMinimum(t *testing.T) {
	chip := synthChip()
	s := synthSigner(t, "Milan-B1", chip)
	milan := snpext.CPUID{Family: 0x19, Model: 0x01, Stepping: 1}
	raw, p := synthReport(t, s, milan, chip, []byte("launch nonce"))
	table := snpTable(snpext.VCEK, s.Vcek.Raw)
	if _, err := synthVerifier(t, s).VerifySNP(raw, table, p); err != nil {
		t.Fatalf("LAUNCH_TCB at the minimum: %v", err)
	}
	old := fakecvm.TCBValue(t, kds.TCBParts{BlSpl: 1, TeeSpl: 0, SnpSpl: 1, UcodeSpl: 10})
	binary.LittleEndian.PutUint64(raw[0x1F0:], old)
	resign(t, s, raw)
	_, err := synthVerifier(t, s).VerifySNP(raw, table, p)
	wantErr(t, err, KindPolicy, "LAUNCH_TCB below minimum", "relaunch the pod")
}

// A min_tcb is a TCB_VERSION in one product line's layout. Written for
// Milan and Genoa (snp in byte 6) and applied to a Turin report, whose
// layout reserves byte 6, it would judge no snp level at all (a Turin
// report at snp=1 passing a minimum meant as snp=8), and the other way
// round: refused, naming the layout.
func TestMinTCBOfAnotherProductLine(t *testing.T) {
	turin := synthVLEKCase{snpext.Turin, snpext.CPUID{Family: 0x1A, Model: 0x02, Stepping: 1},
		snpext.TCB{Line: snpext.Turin, FMC: 3, Bootloader: 3, TEE: 0, SNP: 1, Microcode: 97}}
	s := turin.signer(t)
	raw, p := turin.report(t, s, []byte("layout nonce"))
	p.MinTCB = snpext.TCB{Line: snpext.Milan, Bootloader: 3, SNP: 8, Microcode: 71}.Raw()
	_, err := rootsVerifier(t, vlekRoots(s)).VerifySNP(raw, snpTable(snpext.VLEK, s.Vlek.Raw), p)
	wantErr(t, err, KindConfig, "min_tcb", "reserved in the Turin layout")

	chip := synthChip()
	ms := synthSigner(t, "Milan-B1", chip)
	raw, p = synthReport(t, ms, snpext.CPUID{Family: 0x19, Model: 0x01, Stepping: 1}, chip, []byte("layout nonce"))
	p.MinTCB = snpext.TCB{Line: snpext.Turin, Bootloader: 1, SNP: 2, Microcode: 71}.Raw()
	_, err = synthVerifier(t, ms).VerifySNP(raw, snpTable(snpext.VCEK, ms.Vcek.Raw), p)
	wantErr(t, err, KindConfig, "min_tcb", "reserved in the Milan layout")
}

// The verifier caches a chain it verified, but judges its revocation
// every time: a CRL past its next update fails a chip seen before, as it
// fails a new one.
func TestMaliciousHostStaleCRLAfterCache(t *testing.T) {
	chip := synthChip()
	s := synthSigner(t, "Milan-B1", chip)
	raw, p := synthReport(t, s, snpext.CPUID{Family: 0x19, Model: 0x01, Stepping: 1}, chip, []byte("crl nonce"))
	table := snpTable(snpext.VCEK, s.Vcek.Raw)
	now := time.Now()
	crl := synthCRL(t, s.Ark, s.Keys.Ark, now.Add(time.Hour), big.NewInt(0x7777))
	v, err := NewVerifier(Trust{Mode: ModeSNP, SNPRoots: fakecvm.RootsPEM(s), AMDCRLs: [][]byte{crl}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.VerifySNP(raw, table, p); err != nil {
		t.Fatal(err)
	}
	if _, hit := v.cachedVCEK(s.Vcek.Raw); !hit {
		t.Fatal("the chain was not cached: the test would not test the cache")
	}
	now = now.Add(2 * time.Hour)
	_, err = v.VerifySNP(raw, table, p)
	wantErr(t, err, KindConfig, "AMD Milan CRL", "out of date")
}

// A CRL fetched from AMD's KDS serves until its next update, a day at
// most (one without a next update too), and is asked for again at most
// once a minute while the KDS serves an out-of-date one.
func TestFetchedCRLRefetch(t *testing.T) {
	t0 := time.Now()
	crl := func(next time.Time) *amdCRL { return &amdCRL{crl: &x509.RevocationList{NextUpdate: next}} }
	for name, tc := range map[string]struct {
		f     fetchedCRL
		now   time.Time
		stale bool
	}{
		"none yet":                         {fetchedCRL{}, t0, true},
		"before its next update":           {fetchedCRL{crl(t0.Add(time.Hour)), t0}, t0.Add(30 * time.Minute), false},
		"past its next update":             {fetchedCRL{crl(t0.Add(time.Hour)), t0}, t0.Add(2 * time.Hour), true},
		"past its next update, just asked": {fetchedCRL{crl(t0.Add(-time.Hour)), t0}, t0.Add(30 * time.Second), false},
		"no next update, under a day":      {fetchedCRL{crl(time.Time{}), t0}, t0.Add(23 * time.Hour), false},
		"no next update, over a day":       {fetchedCRL{crl(time.Time{}), t0}, t0.Add(25 * time.Hour), true},
		"next update far off, over a day":  {fetchedCRL{crl(t0.Add(30 * 24 * time.Hour)), t0}, t0.Add(25 * time.Hour), true},
	} {
		if got := tc.f.stale(tc.now); got != tc.stale {
			t.Errorf("%s: stale = %v, want %v", name, got, tc.stale)
		}
	}
}
