package attest

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-tdx-guest/testing/testdata"
)

// rejection is one piece of evidence that must be refused, with the kind,
// the field and a part of the message the refusal must carry.
type rejection struct {
	name  string
	run   func(t *testing.T) error
	kind  Kind
	field string
	want  string
}

// sameMessage maps cases to an earlier case that must fail with the same
// message (one failure, reached another way); all other messages differ.
var sameMessage = map[string]string{
	"bad signature (flipped signature byte)": "bad signature (flipped REPORT_ID byte)",
	"certificate table without a VCEK":       "no certificate table",
}

func snpRejections() []rejection {
	// sim runs f's report, optionally altered, through a sim verifier of f's node.
	sim := func(setup func(t *testing.T, f *fixture), alter func(raw []byte) []byte) func(t *testing.T) error {
		return func(t *testing.T) error {
			f := newFixture(t)
			if setup != nil {
				setup(t, f)
			}
			raw := f.report(t)
			if alter != nil {
				raw = alter(raw)
			}
			_, err := simVerifier(t, f.sp).VerifySNP(raw, f.sp.CertTable(), &f.policy)
			return err
		}
	}
	// resigned has f's report altered by alter, then properly signed.
	resigned := func(alter func(r *spb.Report)) func(t *testing.T) error {
		return func(t *testing.T) error {
			f := newFixture(t)
			r, err := f.sp.ReportProto(f.req)
			if err != nil {
				t.Fatal(err)
			}
			alter(r)
			raw, err := f.sp.Sign(r)
			if err != nil {
				t.Fatal(err)
			}
			_, err = simVerifier(t, f.sp).VerifySNP(raw, f.sp.CertTable(), &f.policy)
			return err
		}
	}
	flip := func(off int) func([]byte) []byte {
		return func(raw []byte) []byte { raw[off] ^= 0x01; return raw }
	}
	return []rejection{
		{"wrong measurement", sim(func(t *testing.T, f *fixture) {
			f.req.Measurement = sha384("an initrd swapped on disk")
		}, nil), KindMismatch, "measurement", "(vCPUs=1; the firmware, kernel, initrd or command line differs from the manifest?)"},

		{"wrong vCPU count", sim(func(t *testing.T, f *fixture) {
			f.policy.VCPUs = 4 // launched for 4, but the report measures the 1-vCPU shape
		}, nil), KindMismatch, "measurement", "mismatch: expected " + measurement4 + ", got " + measurement1 + " (vCPUs=4; this is the measurement of the vCPUs=1 shape"},

		{"no accepted shape", sim(func(t *testing.T, f *fixture) {
			f.policy.VCPUs = 0
			f.req.Measurement = sha384("a 2-vCPU launch")
		}, nil), KindMismatch, "measurement", "expected one of " + measurement1 + " (vCPUs=1), " + measurement4 + " (vCPUs=4)"},

		{"bad signature (flipped REPORT_ID byte)", sim(nil, flip(0x140)), KindSignature, "report signature", "the report was altered after it was signed"},

		{"bad signature (flipped signature byte)", sim(nil, flip(0x2A0+5)), KindSignature, "report signature", "report signature verification error"},

		{"signature from another node's sim root", func(t *testing.T) error {
			f := newFixture(t)
			_, other := nodes(t)
			raw, err := other.Report(f.req)
			if err != nil {
				t.Fatal(err)
			}
			_, err = simVerifier(t, f.sp).VerifySNP(raw, other.CertTable(), &f.policy)
			return err
		}, KindSignature, "VCEK certificate chain", "another node's simulated secure processor"},

		{"another node's report with this node's VCEK", func(t *testing.T) error {
			f := newFixture(t)
			_, other := nodes(t)
			raw, err := other.Report(f.req)
			if err != nil {
				t.Fatal(err)
			}
			_, err = simVerifier(t, f.sp).VerifySNP(raw, f.sp.CertTable(), &f.policy)
			return err
		}, KindMismatch, "CHIP_ID", "the VCEK is another chip's"},

		{"wrong nonce", sim(func(t *testing.T, f *fixture) {
			copy(f.req.ReportData[:], "a nonce the verifier never sent")
		}, nil), KindMismatch, "REPORT_DATA (nonce)", "the evidence is not fresh"},

		{"replayed report", func(t *testing.T) error {
			f := newFixture(t)
			v := simVerifier(t, f.sp)
			raw := f.report(t)
			if _, err := v.VerifySNP(raw, f.sp.CertTable(), &f.policy); err != nil {
				t.Fatalf("first use: %v", err)
			}
			f.policy.Nonce = Hex("a fresh challenge for the re-attestation")
			_, err := v.VerifySNP(raw, f.sp.CertTable(), &f.policy)
			return err
		}, KindMismatch, "REPORT_DATA (nonce)", "expected " + Hex("a fresh challenge for the re-attestation").String()},

		{"debug policy bit set", sim(func(t *testing.T, f *fixture) {
			f.req.Policy = 0x30000 | 1<<19
		}, nil), KindPolicy, "guest policy DEBUG bit", "expected 0, got 1 (POLICY=0xb0000)"},

		{"TCB below minimum", sim(func(t *testing.T, f *fixture) {
			min := f.sp.TCB()
			min.SnpSpl++
			tcb, err := kds.ComposeTCBParts(min)
			if err != nil {
				t.Fatal(err)
			}
			f.policy.MinTCB = uint64(tcb)
		}, nil), KindPolicy, "TCB below minimum", "expected at least bl=3 tee=0 snp=9 ucode=115, got bl=3 tee=0 snp=8 ucode=115"},

		{"wrong HOST_DATA", sim(func(t *testing.T, f *fixture) {
			copy(f.req.HostData[:], "init data the pod did not ask for")
		}, nil), KindMismatch, "HOST_DATA", "the pod's init data differs"},

		{"wrong CHIP_ID", sim(func(t *testing.T, f *fixture) {
			_, other := nodes(t)
			id := other.ChipID()
			f.policy.ChipID = id[:]
		}, nil), KindMismatch, "CHIP_ID", "the VM runs on another machine"},

		{"wrong VMPL", sim(func(t *testing.T, f *fixture) {
			f.req.VMPL = 2
			zero := 0
			f.policy.VMPL = &zero
		}, nil), KindMismatch, "VMPL", "expected 0, got 2"},

		{"truncated report", sim(nil, func(raw []byte) []byte { return raw[:1000] }),
			KindFormat, "report size", "expected 1184 bytes, got 1000 bytes"},

		{"unknown report version", resigned(func(r *spb.Report) {
			r.Version = 9 // properly signed, but of a version nobody knows
		}), KindFormat, "report version", "expected 2 to 5, got 9"},

		{"firmware TCB not committed (provisional firmware)", resigned(func(r *spb.Report) {
			r.CommittedTcb = 0 // provisional firmware: current TCB not committed
		}), KindPolicy, "provisional firmware (COMMITTED_TCB below CURRENT_TCB)", "allow_provisional_firmware"},

		{"VLEK-signed report in sim mode", resigned(func(r *spb.Report) {
			r.SignerInfo = abi.ComposeSignerInfo(abi.SignerInfo{SigningKey: abi.VlekReportSigner})
		}), KindRoot, "report signing key", "signed by the VLEK, the simulated secure processor signs with its VCEK"},

		{"no certificate table", func(t *testing.T) error {
			f := newFixture(t)
			_, err := simVerifier(t, f.sp).VerifySNP(f.report(t), nil, &f.policy)
			return err
		}, KindFormat, "certificate table", "no VCEK certificate"},

		{"certificate table without a VCEK", func(t *testing.T) error {
			f := newFixture(t)
			table := abi.CertsFromProto(&spb.CertificateChain{AskCert: f.sp.ASK().Raw, ArkCert: f.sp.ARK().Raw}).Marshal()
			_, err := simVerifier(t, f.sp).VerifySNP(f.report(t), table, &f.policy)
			return err
		}, KindFormat, "certificate table", "no VCEK certificate"},

		{"policy without a nonce", sim(func(t *testing.T, f *fixture) {
			f.policy.Nonce = nil
		}, nil), KindConfig, "policy", "no nonce"},

		{"policy without the launched shape", sim(func(t *testing.T, f *fixture) {
			f.policy.VCPUs = 2
		}, nil), KindConfig, "policy", "no measurement for the launched shape vCPUs=2 (the policy has vCPUs=1, vCPUs=4)"},

		{"sim report in hardware mode", func(t *testing.T) error {
			f := newFixture(t)
			v, err := NewVerifier(Trust{Mode: ModeSNP})
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.VerifySNP(f.report(t), f.sp.CertTable(), &f.policy)
			return err
		}, KindRoot, "report signing key", "trusts AMD's roots only"},
	}
}

func tdxRejections() []rejection {
	return []rejection{
		{"TDX quote with a wrong MRTD", func(t *testing.T) error {
			p := samplePolicy(t)
			p.MRTD = mustHex(t, otherMRTD)
			_, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote, p)
			return err
		}, KindMismatch, "MRTD", "MRTD mismatch: expected " + otherMRTD + ", got " + sampleMRTD},

		{"TDX sample quote with a bad signature", func(t *testing.T) error {
			q := append([]byte(nil), testdata.RawQuote...)
			q[48+520] ^= 0x01 // first REPORT_DATA byte of the TD quote body
			_, err := tdxVerifier(t).VerifyTDX(q, samplePolicy(t))
			return err
		}, KindSignature, "TDX quote signature", "altered after it was signed"},

		{"TDX quote with a wrong nonce", func(t *testing.T) error {
			p := samplePolicy(t)
			p.Nonce = Hex("another challenge")
			_, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote, p)
			return err
		}, KindMismatch, "REPORT_DATA (nonce)", "not fresh"},

		{"TDX quote with a wrong MRCONFIGID", func(t *testing.T) error {
			p := samplePolicy(t)
			p.MRConfigID = mustHex(t, otherMRTD)
			_, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote, p)
			return err
		}, KindMismatch, "MRCONFIGID", "init data differs"},

		{"TDX quote with a wrong RTMR", func(t *testing.T) error {
			p := samplePolicy(t)
			p.RTMRs = []Hex{nil, nil, mustHex(t, otherMRTD)}
			_, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote, p)
			return err
		}, KindMismatch, "RTMR[2]", "expected " + otherMRTD},

		{"truncated TDX quote", func(t *testing.T) error {
			_, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote[:600], samplePolicy(t))
			return err
		}, KindFormat, "TDX quote", "truncated"},

		{"TDX quote in sim mode", func(t *testing.T) error {
			this, _ := nodes(t)
			_, err := simVerifier(t, this).VerifyTDX(testdata.RawQuote, samplePolicy(t))
			return err
		}, KindConfig, "trust", "configured for sim and accepts no TDX quotes"},

		{"SNP report in TDX mode", func(t *testing.T) error {
			f := newFixture(t)
			_, err := tdxVerifier(t).VerifySNP(f.report(t), f.sp.CertTable(), &f.policy)
			return err
		}, KindConfig, "trust", "configured for TDX"},
	}
}

// TestRejections checks that every piece of bad evidence is refused with a
// structured error of its own: the right kind and field, the expected and
// actual values, and a message no other case produces.
func TestRejections(t *testing.T) {
	seen := map[string]string{}
	cases := append(snpRejections(), tdxRejections()...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run(t)
			if err == nil {
				t.Fatal("accepted")
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v is not an *attest.Error", err, err)
			}
			if e.Kind != tc.kind || e.Field != tc.field {
				t.Errorf("kind %v field %q, want %v %q: %v", e.Kind, e.Field, tc.kind, tc.field, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("message %q\nlacks %q", err, tc.want)
			}
			if strings.Contains(strings.ToLower(err.Error()), "verification failed") && e.Hint == "" {
				t.Errorf("a bare failure message: %v", err)
			}
			if same := sameMessage[tc.name]; same != "" {
				if seen[err.Error()] != same {
					t.Errorf("message differs from case %q's: %v", same, err)
				}
			} else if prev, dup := seen[err.Error()]; dup {
				t.Errorf("same message as case %q: %v", prev, err)
			} else {
				seen[err.Error()] = tc.name
			}
			t.Log(err)
		})
	}
	if len(cases) < 12 {
		t.Errorf("%d rejection cases, want at least 12", len(cases))
	}
}

// The report's signature covers everything before it: a change anywhere in
// the signed part is caught.
func TestEverySignedByteMatters(t *testing.T) {
	f := newFixture(t)
	v := simVerifier(t, f.sp)
	raw := f.report(t)
	for _, off := range []int{0x04, 0x10, 0x50, 0x90, 0xC0, 0x180, 0x1A0, 0x1E8, 0x29F, 0x2A0, abi.ReportSize - 1} {
		altered := append([]byte(nil), raw...)
		altered[off] ^= 0x80
		if _, err := v.VerifySNP(altered, f.sp.CertTable(), &f.policy); err == nil {
			t.Errorf("a report with byte %#x altered verified", off)
		}
	}
}
