package attest

import (
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-sev-guest/verify/trust"
	"github.com/google/go-tdx-guest/testing/testdata"

	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// Real SNP launch digests, from testdata/snp/VECTORS.md: the
// AmdSev OVMF fixture with an empty kernel and initrd, features 0x1, for 1
// and for 4 vCPUs.
const (
	measurement1 = "ddc5224521617a536ee7ce9dd6224d1b58a8d4fda1c741f3ac99fc4bfa04ba6e9fc98646d4a07a9079397fa3852819b5"
	measurement4 = "5061fffb019493a903613d56d54b94912a1a2f9e4502385f5c194616753720a92441310ba6c4933de877c36e23046ad5"
	// sampleMRTD is the MRTD of go-tdx-guest's testing/testdata
	// tdx_prod_quote_SPR_E4.dat, as VECTORS.md gives it.
	sampleMRTD = "6363b8043668a3ad953278e10389574d326c6749fb78aa810ecd9336923db86f22fc00b8dcd404bc10d5e119d7215cbb"
	// otherMRTD is virtee/tdx-measure's published MRTD for Ubuntu 25.04's OVMF.fd (VECTORS.md).
	otherMRTD = "7357a10d2e2724dffe68813e3cc4cfcde6814d749f2fb62e3953e54f6e0b50a219786afe2cd478f684b52c61837e1114"
)

// sims are two nodes' simulated secure processors (two RSA-4096 keys each,
// so they are made once per test binary).
var sims struct {
	once        sync.Once
	this, other *sim.SP
	err         error
}

func nodes(tb testing.TB) (this, other *sim.SP) {
	tb.Helper()
	sims.once.Do(func() {
		var wg sync.WaitGroup
		var errs [2]error
		wg.Add(2)
		go func() { defer wg.Done(); sims.this, errs[0] = sim.New(sim.DefaultTCB) }()
		go func() { defer wg.Done(); sims.other, errs[1] = sim.New(sim.DefaultTCB) }()
		wg.Wait()
		sims.err = errors.Join(errs[:]...)
	})
	if sims.err != nil {
		tb.Fatal(sims.err)
	}
	return sims.this, sims.other
}

func mustHex(tb testing.TB, s string) Hex {
	tb.Helper()
	h, err := ParseHex(s)
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

// fixture is one sim-mode verification: a request the simulated secure
// processor signs and the policy the verifier checks it against.
type fixture struct {
	sp     *sim.SP
	req    sim.Request
	policy Policy
}

func newFixture(tb testing.TB) *fixture {
	this, _ := nodes(tb)
	nonce := sha256.Sum256([]byte("nonce " + tb.Name()))
	hostData := sha256.Sum256([]byte(`{"policy":{"exec":false}}`))
	f := &fixture{sp: this}
	copy(f.req.Measurement[:], mustHex(tb, measurement1))
	f.req.HostData = hostData
	copy(f.req.ReportData[:], nonce[:])
	minTCB, err := kds.ComposeTCBParts(sim.DefaultTCB)
	if err != nil {
		tb.Fatal(err)
	}
	f.policy = Policy{
		Measurements: map[int]Hex{1: mustHex(tb, measurement1), 4: mustHex(tb, measurement4)},
		VCPUs:        1,
		MinTCB:       uint64(minTCB),
		HostData:     hostData[:],
		Nonce:        nonce[:],
	}
	return f
}

func (f *fixture) report(tb testing.TB) []byte {
	tb.Helper()
	raw, err := f.sp.Report(f.req)
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

func simVerifier(tb testing.TB, sp *sim.SP) *Verifier {
	tb.Helper()
	v, err := NewVerifier(Trust{Mode: ModeSim, SimCertChain: sp.CertChainPEM()})
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

func tdxVerifier(tb testing.TB) *Verifier {
	tb.Helper()
	// The sample quote's PCK chain was valid then (go-tdx-guest's own tests use this date).
	v, err := NewVerifier(Trust{Mode: ModeTDX, Now: func() time.Time { return time.Date(2023, time.July, 1, 1, 0, 0, 0, time.UTC) }})
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

func samplePolicy(tb testing.TB) *Policy {
	tb.Helper()
	q, err := ParseTDXQuote(testdata.RawQuote)
	if err != nil {
		tb.Fatal(err)
	}
	return &Policy{MRTD: mustHex(tb, sampleMRTD), Nonce: q.GetTdQuoteBody().GetReportData()}
}

func TestSimReportVerifies(t *testing.T) {
	f := newFixture(t)
	v := simVerifier(t, f.sp)
	for i := range 2 { // the second round takes the cached-chain path
		c, err := v.VerifySNP(f.report(t), f.sp.CertTable(), &f.policy)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		id := f.sp.ChipID()
		if c.VCPUs != 1 || c.Measurement.String() != measurement1 || !c.Simulated || c.Mode != ModeSim ||
			string(c.HostData) != string(f.policy.HostData) || string(c.ChipID) != string(id[:]) || c.ReportVersion != sim.ReportVersion {
			t.Errorf("round %d: claims %+v", i, c)
		}
	}
	// With VCPUs unset, any shape of the policy is accepted and named.
	f.policy.VCPUs = 0
	copy(f.req.Measurement[:], mustHex(t, measurement4))
	c, err := v.VerifySNP(f.report(t), f.sp.CertTable(), &f.policy)
	if err != nil {
		t.Fatal(err)
	}
	if c.VCPUs != 4 {
		t.Errorf("matched shape vCPUs=%d, want 4", c.VCPUs)
	}
	// A pinned chip id and VMPL that match.
	id := f.sp.ChipID()
	f.policy.ChipID = id[:]
	vmpl := 0
	f.policy.VMPL = &vmpl
	if _, err := v.VerifySNP(f.report(t), f.sp.CertTable(), &f.policy); err != nil {
		t.Fatal(err)
	}
}

func TestSimRootRefusedInHardwareMode(t *testing.T) {
	f := newFixture(t)
	v, err := NewVerifier(Trust{Mode: ModeSNP})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.VerifySNP(f.report(t), f.sp.CertTable(), &f.policy)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindRoot || !strings.Contains(err.Error(), "SIMULATED") {
		t.Fatalf("a sim report in snp mode: %v, want a root error naming the simulated chain", err)
	}
	t.Log(err)
}

func TestTDXSampleQuote(t *testing.T) {
	q, err := ParseTDXQuote(testdata.RawQuote)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(q.GetTdQuoteBody().GetMrTd()); got != sampleMRTD {
		t.Errorf("sample quote MRTD %s, want VECTORS.md's %s", got, sampleMRTD)
	}
	c, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote, samplePolicy(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.MRTD.String() != sampleMRTD || len(c.RTMRs) != 4 || c.QuoteVersion != 4 {
		t.Errorf("claims %+v", c)
	}
	// The RTMRs it reports are the ones a policy can require.
	p := samplePolicy(t)
	p.RTMRs = []Hex{nil, c.RTMRs[1], nil, c.RTMRs[3]}
	p.MRConfigID = c.MRConfigID
	if _, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote, p); err != nil {
		t.Fatal(err)
	}
}

func TestTrustConfig(t *testing.T) {
	this, _ := nodes(t)
	for _, tc := range []struct {
		name  string
		trust Trust
		want  string
	}{
		{"sim without root", Trust{Mode: ModeSim}, "needs the node's simulated root"},
		{"hardware with a sim root", Trust{Mode: ModeSNP, SimCertChain: this.CertChainPEM()}, "must not be configured"},
		{"sim with AMD's real root", Trust{Mode: ModeSim, SimCertChain: trust.AskArkMilanVcekBytes}, "never trusts real vendor roots"},
		{"garbage root", Trust{Mode: ModeSim, SimCertChain: []byte("junk")}, "simulated root"},
		{"unknown mode", Trust{Mode: "sev"}, `unknown mode "sev"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewVerifier(tc.trust)
			var e *Error
			if !errors.As(err, &e) || e.Kind != KindConfig || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want a config error containing %q", err, tc.want)
			}
		})
	}
}

func TestSimTrustFromStateDir(t *testing.T) {
	dir := t.TempDir()
	this, _ := nodes(t)
	if err := os.WriteFile(filepath.Join(dir, sim.CertChainFile), this.CertChainPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := SimTrust(dir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(tr)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	if _, err := v.VerifySNP(f.report(t), f.sp.CertTable(), &f.policy); err != nil {
		t.Fatal(err)
	}
	if _, err := SimTrust(t.TempDir()); err == nil {
		t.Error("SimTrust on a dir without a simulated root succeeded")
	}
}

func TestLoadPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.json")
	doc := `{"measurements": {"1": "` + measurement1 + `", "4": "0x` + measurement4 + `"}, "vcpus": 4, "min_tcb": 12345,
		"host_data": "` + strings.Repeat("ab", 32) + `", "nonce": "00ff"}`
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := LoadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	if p.Measurements[1].String() != measurement1 || p.Measurements[4].String() != measurement4 || p.VCPUs != 4 ||
		p.MinTCB != 12345 || len(p.HostData) != 32 || p.Nonce.String() != "00ff" {
		t.Errorf("policy %+v", p)
	}
	if err := os.WriteFile(path, []byte(`{"measurement": "00"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPolicy(path); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("a misspelt field: %v", err)
	}
	if err := os.WriteFile(path, []byte(`{"nonce": "xyz"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPolicy(path); err == nil || !strings.Contains(err.Error(), "not a hex string") {
		t.Errorf("bad hex: %v", err)
	}
}

// sha384 is a digest no fixture launches with.
func sha384(s string) [48]byte { return sha512.Sum384([]byte(s)) }

func TestNewNonce(t *testing.T) {
	a, err := NewNonce()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewNonce()
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != NonceSize || len(b) != NonceSize || a.String() == b.String() {
		t.Errorf("nonces %s and %s: want two different %d-byte values", a, b, NonceSize)
	}
	// A fresh nonce is what a re-attestation checks against.
	f := newFixture(t)
	f.policy.Nonce = a
	copy(f.req.ReportData[:], a)
	if _, err := simVerifier(t, f.sp).VerifySNP(f.report(t), f.sp.CertTable(), &f.policy); err != nil {
		t.Fatal(err)
	}
}
