package attest

import (
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/google/go-tdx-guest/testing/testdata"
)

// FuzzVerifySNP feeds altered reports and certificate tables to a sim
// verifier: it must never panic, never accept a report other than the one
// the simulated secure processor signed, and always fail with an *Error.
func FuzzVerifySNP(f *testing.F) {
	fx := newFixture(f)
	good := fx.report(f)
	table := fx.sp.CertTable()
	f.Add(good, table)
	f.Add(good[:100], table)
	f.Add(good, table[:40])
	f.Add([]byte{}, []byte{})
	v := simVerifier(f, fx.sp)
	f.Fuzz(func(t *testing.T, report, certs []byte) {
		_, err := v.VerifySNP(report, certs, &fx.policy)
		if err == nil {
			if string(report) != string(good) {
				t.Fatalf("an altered report verified: %x", report)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %T is not an *attest.Error: %v", err, err)
		}
	})
}

// FuzzVerifyTDX does the same for TDX quotes (go-tdx-guest's v4 sample,
// dcap-qvl's v5).
func FuzzVerifyTDX(f *testing.F) {
	f.Add(testdata.RawQuote)
	f.Add(testdata.RawQuote[:1020])
	v5, err := os.ReadFile(dcapOutdated)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(v5)
	f.Add(v5[:1200])
	v := tdxVerifier(f)
	p := samplePolicy(f)
	f.Fuzz(func(t *testing.T, quote []byte) {
		_, err := v.VerifyTDX(quote, p)
		var e *Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("error %T is not an *attest.Error: %v", err, err)
		}
	})
}

// One verifier serves many pods at once: concurrent verifications (and the
// chain cache behind them) give each its own, correct answer.
func TestConcurrentVerify(t *testing.T) {
	f := newFixture(t)
	_, other := nodes(t)
	v := simVerifier(t, f.sp)
	good := f.report(t)
	foreign, err := other.Report(f.req)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				if i%2 == 0 {
					if _, err := v.VerifySNP(good, f.sp.CertTable(), &f.policy); err != nil {
						errs <- err
					}
				} else if _, err := v.VerifySNP(foreign, other.CertTable(), &f.policy); err == nil {
					errs <- errors.New("another node's report verified")
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
