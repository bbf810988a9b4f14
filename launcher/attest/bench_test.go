package attest

import (
	"crypto/ecdsa"
	"crypto/sha512"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-tdx-guest/testing/testdata"
)

// BenchmarkVerifySNP measures verified SNP reports per second on one core
// with the chain cached (the steady state of a node), next to the raw
// ECDSA P-384 verifications per second of the same report signature, and
// reports their ratio (the goal is ≥ 0.8).
func BenchmarkVerifySNP(b *testing.B) {
	f := newFixture(b)
	v := simVerifier(b, f.sp)
	raw := f.report(b)
	table := f.sp.CertTable()
	if _, err := v.VerifySNP(raw, table, &f.policy); err != nil { // fills the chain cache
		b.Fatal(err)
	}
	pub := f.sp.VCEK().PublicKey.(*ecdsa.PublicKey)
	digest := sha512.Sum384(abi.SignedComponent(raw))
	sig, err := abi.ReportToSignatureDER(raw)
	if err != nil {
		b.Fatal(err)
	}
	var tVerify, tECDSA time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := v.VerifySNP(raw, table, &f.policy); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if !ecdsa.VerifyASN1(pub, digest[:], sig) {
			b.Fatal("raw ECDSA verification failed")
		}
		tVerify += mid.Sub(start)
		tECDSA += time.Since(mid)
	}
	b.StopTimer()
	reports := float64(b.N) / tVerify.Seconds()
	raws := float64(b.N) / tECDSA.Seconds()
	b.ReportMetric(reports, "reports/s")
	b.ReportMetric(raws, "ecdsa-p384/s")
	b.ReportMetric(reports/raws, "ratio")
}

// BenchmarkVerifySNPColdChain is the first report of a chip: chain
// verification (two RSA-4096 PSS signatures and the KDS checks) included.
func BenchmarkVerifySNPColdChain(b *testing.B) {
	f := newFixture(b)
	raw := f.report(b)
	table := f.sp.CertTable()
	for i := 0; i < b.N; i++ {
		v := simVerifier(b, f.sp)
		if _, err := v.VerifySNP(raw, table, &f.policy); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyTDX is a TDX quote (go-tdx-guest's sample) without
// collateral: PCK chain, QE report and quote signatures.
func BenchmarkVerifyTDX(b *testing.B) {
	v := tdxVerifier(b)
	p := samplePolicy(b)
	for i := 0; i < b.N; i++ {
		if _, err := v.VerifyTDX(testdata.RawQuote, p); err != nil {
			b.Fatal(err)
		}
	}
}
