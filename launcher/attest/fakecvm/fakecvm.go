// Package fakecvm is, for tests, an SEV-SNP node that is itself a
// confidential VM: go-sev-guest's fake sev-guest device answering with
// reports of the node, signed by go-sev-guest's fake AMD secure processor
// (its own test-only ARK, ASK and VCEK), whose VCEK carries a realistic
// TCB so that go-sev-guest's validation accepts the pair.
package fakecvm

import (
	"crypto/sha512"
	"encoding/pem"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	labi "github.com/google/go-sev-guest/client/linuxabi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	sevtest "github.com/google/go-sev-guest/testing"
)

// TCB is the fake chip's TCB: Milan patch levels as real chips report them.
var TCB = kds.TCBParts{BlSpl: 3, TeeSpl: 0, SnpSpl: 8, UcodeSpl: 115}

// TCBString is TCB as the node-cvm annotation writes it.
const TCBString = "bl=3,tee=0,snp=8,ucode=115"

// Digest is the fake node's launch digest (SHA-384 of "node firmware").
var Digest = func() []byte { d := sha512.Sum384([]byte("node firmware")); return d[:] }()

// Policy is the SNP guest policy of a production node: SMT allowed, bit 17
// set, debug off. DebugPolicy is the same with debugging allowed.
const (
	Policy      uint64 = 0x30000
	DebugPolicy uint64 = Policy | 1<<19
)

// Signer returns a fake AMD secure processor with keys
// (sevtest.DefaultAmdKeys, or others for a chip whose roots differ).
func Signer(tb testing.TB, keys *sevtest.AmdKeys) *sevtest.AmdSigner {
	tb.Helper()
	now := time.Now().Add(-time.Hour)
	b := &sevtest.AmdSignerBuilder{
		Keys: keys, ProductName: "Milan-B1", CSPID: "go-sev-guest",
		ArkCreationTime: now, AskCreationTime: now, AsvkCreationTime: now, VcekCreationTime: now,
		VcekCustom: sevtest.CertOverride{Extensions: sevtest.CustomExtensions(TCB, make([]byte, abi.ChipIDSize), "go-sev-guest", "Milan-B1")},
	}
	s, err := b.TestOnlyCertChain()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// RootsPEM is the ASK and ARK (KDS cert_chain order) a verifier trusting
// s is configured with (attest.Trust.SNPRoots).
func RootsPEM(s *sevtest.AmdSigner) []byte {
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Ask.Raw})
	return append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Ark.Raw})...)
}

// TCBValue is p as a TCB_VERSION.
func TCBValue(tb testing.TB, p kds.TCBParts) uint64 {
	tb.Helper()
	v, err := kds.ComposeTCBParts(p)
	if err != nil {
		tb.Fatal(err)
	}
	return uint64(v)
}

// Device returns a fake sev-guest device on signer's chip that answers
// the report data nonce (zero-padded) with a report of the node launched
// with guest policy policy and measurement Digest.
func Device(tb testing.TB, signer *sevtest.AmdSigner, nonce []byte, policy uint64) *sevtest.Device {
	tb.Helper()
	var rd [64]byte
	copy(rd[:], nonce)
	tcb := TCBValue(tb, TCB)
	raw, err := abi.ReportToAbiBytes(&spb.Report{
		Version: 2, Policy: policy, SignatureAlgo: abi.SignEcdsaP384Sha384,
		ReportData: rd[:], Measurement: Digest,
		FamilyId: make([]byte, 16), ImageId: make([]byte, 16), HostData: make([]byte, 32),
		IdKeyDigest: make([]byte, 48), AuthorKeyDigest: make([]byte, 48), ReportId: make([]byte, 32), ReportIdMa: make([]byte, 32),
		ChipId: signer.HWID[:], CurrentTcb: tcb, ReportedTcb: tcb, CommittedTcb: tcb, LaunchTcb: tcb,
		PlatformInfo: 1, Signature: make([]byte, abi.SignatureSize),
	})
	if err != nil {
		tb.Fatal(err)
	}
	var out [labi.SnpReportRespReportSize]byte
	copy(out[:], raw)
	d, err := sevtest.TcDevice([]sevtest.TestCase{{Name: "node", Input: rd, Output: out}},
		&sevtest.DeviceOptions{Now: time.Now(), Signer: signer, Product: abi.DefaultSevProduct()})
	if err != nil {
		tb.Fatal(err)
	}
	return d
}
