package sim

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha512"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
)

// SP is one node's simulated secure processor.
type SP struct {
	keys   *keys
	chain  *chain
	chipID [abi.ChipIDSize]byte
	tcb    kds.TCBParts
}

// ChipID returns the simulated chip's id (the VCEK's HWID and the
// reports' CHIP_ID).
func (sp *SP) ChipID() [abi.ChipIDSize]byte { return sp.chipID }

// TCB returns the simulated firmware's TCB (reported, current, committed
// and launch TCB of every report).
func (sp *SP) TCB() kds.TCBParts { return sp.tcb }

// ARK returns the simulated root certificate.
func (sp *SP) ARK() *x509.Certificate { return sp.chain.ark }

// ASK returns the simulated intermediate certificate.
func (sp *SP) ASK() *x509.Certificate { return sp.chain.ask }

// VCEK returns the simulated chip endorsement certificate.
func (sp *SP) VCEK() *x509.Certificate { return sp.chain.vcek }

// CertChainPEM returns the ASK and the ARK, PEM, in the order of AMD's KDS
// cert_chain endpoint: what a sim-mode verifier trusts.
func (sp *SP) CertChainPEM() []byte {
	var b []byte
	b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: sp.chain.ask.Raw})...)
	return append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: sp.chain.ark.Raw})...)
}

// CertTable returns the certificate table an extended report request
// returns on SEV-SNP hardware (GUID table), holding the VCEK, the ASK and
// the ARK. Verifiers never take their trust anchors from it.
func (sp *SP) CertTable() []byte {
	t := abi.CertsFromProto(&spb.CertificateChain{
		VcekCert: sp.chain.vcek.Raw,
		AskCert:  sp.chain.ask.Raw,
		ArkCert:  sp.chain.ark.Raw,
	})
	return t.Marshal()
}

// DefaultGuestPolicy is the SNP guest policy QEMU launches with by default:
// SMT allowed, the must-be-one bit 17 set, debug and migration forbidden.
const DefaultGuestPolicy uint64 = 0x30000

// ReportVersion is the ATTESTATION_REPORT version the simulation produces.
const ReportVersion = abi.ReportVersion3

// Request is what a report binds: the launch measurement, the pod's
// HOST_DATA, the guest's REPORT_DATA and the launch policy.
type Request struct {
	// Measurement is the SNP launch digest of what the VM was started with
	// (measurements/snp, from the artefacts handed to QEMU).
	Measurement [abi.MeasurementSize]byte
	// HostData is set by the host at launch (the init data digest).
	HostData [abi.HostDataSize]byte
	// ReportData is the guest's request data (its nonce).
	ReportData [abi.ReportDataSize]byte
	// Policy is the guest policy the VM was launched with; zero means
	// DefaultGuestPolicy.
	Policy uint64
	// VMPL is the privilege level of the requesting guest code (0-3).
	VMPL uint32
	// ReportID identifies the guest; zero means a random one.
	ReportID [abi.ReportIDSize]byte
}

// Report returns a signed ATTESTATION_REPORT (abi.ReportSize bytes) for
// req, as the secure processor of the simulated chip would produce it.
func (sp *SP) Report(req Request) ([]byte, error) {
	r, err := sp.ReportProto(req)
	if err != nil {
		return nil, err
	}
	return sp.Sign(r)
}

// ReportProto returns the unsigned report for req (Signature all zero), to
// be signed with Sign. Tests use it to sign reports with altered fields.
func (sp *SP) ReportProto(req Request) (*spb.Report, error) {
	if req.VMPL > 3 {
		return nil, fmt.Errorf("sim: VMPL %d: must be 0-3", req.VMPL)
	}
	policy := req.Policy
	if policy == 0 {
		policy = DefaultGuestPolicy
	}
	if _, err := abi.ParseSnpPolicy(policy); err != nil {
		return nil, fmt.Errorf("sim: guest policy %#x: %w", policy, err)
	}
	tcb, err := kds.ComposeTCBParts(sp.tcb)
	if err != nil {
		return nil, fmt.Errorf("sim: TCB: %w", err)
	}
	reportID := req.ReportID
	if reportID == ([abi.ReportIDSize]byte{}) {
		if _, err := rand.Read(reportID[:]); err != nil {
			return nil, fmt.Errorf("sim: report id: %w", err)
		}
	}
	const build, major, minor = 21, 1, 55 // a plausible SNP firmware
	return &spb.Report{
		Version:         ReportVersion,
		Policy:          policy,
		FamilyId:        make([]byte, abi.FamilyIDSize),
		ImageId:         make([]byte, abi.ImageIDSize),
		Vmpl:            req.VMPL,
		SignatureAlgo:   abi.SignEcdsaP384Sha384,
		CurrentTcb:      uint64(tcb),
		SignerInfo:      abi.ComposeSignerInfo(abi.SignerInfo{SigningKey: abi.VcekReportSigner}),
		ReportData:      append([]byte(nil), req.ReportData[:]...),
		Measurement:     append([]byte(nil), req.Measurement[:]...),
		HostData:        append([]byte(nil), req.HostData[:]...),
		IdKeyDigest:     make([]byte, abi.IDKeyDigestSize),
		AuthorKeyDigest: make([]byte, abi.AuthorKeyDigestSize),
		ReportId:        reportID[:],
		ReportIdMa:      make([]byte, abi.ReportIDMASize),
		ReportedTcb:     uint64(tcb),
		Cpuid1EaxFms:    abi.MaskedCpuid1EaxFromSevProduct(abi.DefaultSevProduct()),
		ChipId:          append([]byte(nil), sp.chipID[:]...),
		CommittedTcb:    uint64(tcb),
		CurrentBuild:    build,
		CurrentMajor:    major,
		CurrentMinor:    minor,
		CommittedBuild:  build,
		CommittedMajor:  major,
		CommittedMinor:  minor,
		LaunchTcb:       uint64(tcb),
		Signature:       make([]byte, abi.SignatureSize),
	}, nil
}

// Sign lays r out in the ABI format and signs it with the VCEK (ECDSA
// P-384 over SHA-384 of the bytes before the signature).
func (sp *SP) Sign(r *spb.Report) ([]byte, error) {
	if r == nil {
		return nil, errors.New("sim: no report to sign")
	}
	raw, err := abi.ReportToAbiBytes(r)
	if err != nil {
		return nil, fmt.Errorf("sim: laying out the report: %w", err)
	}
	digest := sha512.Sum384(abi.SignedComponent(raw))
	rr, ss, err := ecdsa.Sign(rand.Reader, sp.keys.vcek, digest[:])
	if err != nil {
		return nil, fmt.Errorf("sim: signing the report: %w", err)
	}
	if err := abi.SetSignature(rr, ss, raw); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return raw, nil
}
