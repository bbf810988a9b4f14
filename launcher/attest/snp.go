package attest

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/validate"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// snpPolicyDebug is SNP guest policy bit 19: debugging allowed.
const snpPolicyDebug = 1 << 19

// SNPClaims are the verified contents of an SNP report.
type SNPClaims struct {
	Mode          Mode   `json:"mode"`
	Simulated     bool   `json:"simulated"`
	ReportVersion uint32 `json:"report_version"`
	VCPUs         int    `json:"vcpus"`
	Measurement   Hex    `json:"measurement"`
	HostData      Hex    `json:"host_data"`
	ReportData    Hex    `json:"report_data"`
	ChipID        Hex    `json:"chip_id"`
	ReportedTCB   uint64 `json:"reported_tcb"`
	GuestPolicy   uint64 `json:"guest_policy"`
	VMPL          uint32 `json:"vmpl"`
}

// VerifySNP verifies an SEV-SNP ATTESTATION_REPORT (abi.ReportSize bytes)
// and the certificate table that came with it (GUID table, as an extended
// report request returns it; it may be empty when FetchCertificates is
// set) against p. Trust anchors come from the verifier, never from the
// table.
func (v *Verifier) VerifySNP(report, certTable []byte, p *Policy) (_ *SNPClaims, err error) {
	defer recoverMalformed("SNP report", &err)
	if v.trust.Mode == ModeTDX {
		return nil, failure(KindConfig, "trust", errors.New("this verifier is configured for TDX and accepts no SNP reports"), "")
	}
	if p == nil {
		return nil, configErr("no policy")
	}
	if err := p.checkSNP(); err != nil {
		return nil, err
	}
	wantRD, err := p.reportData()
	if err != nil {
		return nil, err
	}
	att, err := parseSNP(report, certTable)
	if err != nil {
		return nil, err
	}
	if err := v.verifySNPSignature(report, att); err != nil {
		return nil, err
	}
	r := att.GetReport()
	vcpus, err := checkSNPFields(r, p, wantRD)
	if err != nil {
		return nil, err
	}
	// go-sev-guest's validation, with the same expectations, catches what
	// the checks above do not (TCB consistency with the VCEK, firmware
	// versions, policy bits, CHIP_ID against the VCEK's HWID, …).
	if err := validate.SnpAttestation(att, &validate.Options{
		GuestPolicy: abi.SnpPolicy{Debug: p.AllowDebug, SMT: true},
		Measurement: p.Measurements[vcpus],
		HostData:    p.HostData,
		ReportData:  wantRD,
		ChipID:      p.ChipID,
		MinimumTCB:  kds.DecomposeTCBVersion(kds.TCBVersion(p.MinTCB)),
		VMPL:        p.VMPL,
	}); err != nil {
		return nil, failure(KindPolicy, "report validation", err, "")
	}
	return &SNPClaims{
		Mode:          v.trust.Mode,
		Simulated:     v.trust.Mode == ModeSim,
		ReportVersion: r.GetVersion(),
		VCPUs:         vcpus,
		Measurement:   r.GetMeasurement(),
		HostData:      r.GetHostData(),
		ReportData:    r.GetReportData(),
		ChipID:        r.GetChipId(),
		ReportedTCB:   r.GetReportedTcb(),
		GuestPolicy:   r.GetPolicy(),
		VMPL:          r.GetVmpl(),
	}, nil
}

// parseSNP checks the report's layout and version and parses the report and
// its certificate table.
func parseSNP(report, certTable []byte) (*spb.Attestation, error) {
	if len(report) != abi.ReportSize {
		hint := "a truncated or padded report"
		if len(report) > abi.ReportSize {
			hint = "pass the certificate table separately"
		}
		return nil, &Error{Kind: KindFormat, Field: "report size", Expected: fmt.Sprintf("%d bytes", abi.ReportSize),
			Actual: fmt.Sprintf("%d bytes", len(report)), Hint: hint}
	}
	if ver := binary.LittleEndian.Uint32(report[0:4]); ver < abi.MinSupportedReportVersion || ver > abi.MaxSupportedReportVersion {
		return nil, &Error{Kind: KindFormat, Field: "report version", Expected: fmt.Sprintf("%d to %d", abi.MinSupportedReportVersion, abi.MaxSupportedReportVersion),
			Actual: fmt.Sprint(ver), Hint: "not an SEV-SNP ATTESTATION_REPORT this verifier knows"}
	}
	r, err := abi.ReportToProto(report)
	if err != nil {
		return nil, failure(KindFormat, "report", err, "malformed ATTESTATION_REPORT")
	}
	chain := &spb.CertificateChain{Extras: map[string][]byte{}}
	if len(certTable) > 0 {
		var t abi.CertTable
		if err := t.Unmarshal(certTable); err != nil {
			return nil, failure(KindFormat, "certificate table", err, "")
		}
		chain = certChain(&t)
	}
	return &spb.Attestation{Report: r, CertificateChain: chain}, nil
}

// certChain sorts a certificate table's entries by GUID, as
// abi.CertTable.Proto does, without its warning on stdout when the VCEK is
// missing (go-tdx-guest points the shared logger at stdout).
func certChain(t *abi.CertTable) *spb.CertificateChain {
	chain := &spb.CertificateChain{Extras: map[string][]byte{}}
	for _, e := range t.Entries {
		switch g := e.GUID.String(); g {
		case abi.VcekGUID:
			chain.VcekCert = e.RawCert
		case abi.VlekGUID:
			chain.VlekCert = e.RawCert
		case abi.AskGUID:
			chain.AskCert = e.RawCert
		case abi.ArkGUID:
			chain.ArkCert = e.RawCert
		default:
			chain.Extras[g] = e.RawCert
		}
	}
	return chain
}

// verifySNPSignature checks that the report's signing key chains to the
// verifier's trusted roots and that it signed the report.
func (v *Verifier) verifySNPSignature(raw []byte, att *spb.Attestation) error {
	info, err := abi.ParseSignerInfo(att.GetReport().GetSignerInfo())
	if err != nil {
		return failure(KindFormat, "report signer info", err, "")
	}
	chain := att.GetCertificateChain()
	if info.SigningKey != abi.VcekReportSigner {
		if v.trust.Mode == ModeSim {
			return failure(KindRoot, "report signing key", fmt.Errorf("signed by the %v, the simulated secure processor signs with its VCEK", info.SigningKey), "")
		}
		if info.SigningKey == abi.VlekReportSigner && len(chain.GetVlekCert()) == 0 {
			return failure(KindFormat, "certificate table", errors.New("no VLEK certificate"),
				"a VLEK-signed report needs the certificate table its host provisioned")
		}
		return v.verifySNPChain(att) // go-sev-guest checks the VLEK chain and signature, uncached
	}
	der := chain.GetVcekCert()
	if len(der) == 0 {
		if v.trust.Mode == ModeSim || !v.trust.FetchCertificates {
			return failure(KindFormat, "certificate table", errors.New("no VCEK certificate"),
				"send the report with the certificate table of an extended report request, or allow fetching certificates")
		}
		return v.verifySNPChain(att)
	}
	vcek, err := trust.ParseCert(der)
	if err != nil {
		return failure(KindFormat, "VCEK certificate", err, "")
	}
	switch sim := sim.IsSimulated(vcek); {
	case sim && v.trust.Mode != ModeSim:
		return failure(KindRoot, "report signing key", errors.New("the VCEK is issued by a c8s SIMULATED secure processor (test only)"),
			"this verifier is configured for hardware ("+string(v.trust.Mode)+") and trusts AMD's roots only")
	case !sim && v.trust.Mode == ModeSim:
		return failure(KindRoot, "report signing key", errors.New("the VCEK is not from a c8s simulated secure processor"),
			"this verifier is configured for sim and trusts the node's simulated root only")
	}
	cached := v.cachedVCEK(der)
	if cached != nil {
		vcek = cached
	}
	if err := verify.SnpReportSignature(raw, vcek); err != nil {
		return failure(KindSignature, "report signature", err, "the report was altered after it was signed, or signed by another key")
	}
	if cached == nil {
		if err := v.verifySNPChain(att); err != nil {
			return err
		}
		v.cacheVCEK(vcek)
	}
	return nil
}

// verifySNPChain verifies the report's certificate chain (and signature)
// with go-sev-guest.
func (v *Verifier) verifySNPChain(att *spb.Attestation) error {
	opts := &verify.Options{
		DisableCertFetching: v.trust.Mode == ModeSim || !v.trust.FetchCertificates,
		CheckRevocations:    v.trust.Mode == ModeSNP && v.trust.FetchCertificates,
		Now:                 v.now(),
		TrustedRoots:        v.snpRoots,
	}
	if err := verify.SnpAttestation(att, opts); err != nil {
		hint := "the VCEK does not chain to AMD's roots"
		if v.trust.Mode == ModeSim {
			hint = "the report comes from another node's simulated secure processor, or the node's simulated identity was re-created"
		}
		return failure(KindSignature, "certificate chain", err, hint)
	}
	return nil
}

// checkSNPFields applies the policy to the report's fields and returns the
// matched vCPU shape.
func checkSNPFields(r *spb.Report, p *Policy, wantRD []byte) (int, error) {
	if r.GetPolicy()&snpPolicyDebug != 0 && !p.AllowDebug {
		return 0, &Error{Kind: KindPolicy, Field: "guest policy DEBUG bit", Expected: "0", Actual: fmt.Sprintf("1 (POLICY=%#x)", r.GetPolicy()),
			Hint: "the VM was launched with debugging allowed, so the host can read its memory; the policy forbids debug guests"}
	}
	min := kds.DecomposeTCBVersion(kds.TCBVersion(p.MinTCB))
	got := kds.DecomposeTCBVersion(kds.TCBVersion(r.GetReportedTcb()))
	if !kds.TCBPartsLE(min, got) {
		return 0, &Error{Kind: KindPolicy, Field: "TCB below minimum", Expected: fmt.Sprintf("at least %s", tcbString(min)), Actual: tcbString(got),
			Hint: "the node's SEV firmware or microcode needs an update"}
	}
	vcpus, err := p.matchMeasurement(r.GetMeasurement())
	if err != nil {
		return 0, err
	}
	if len(p.HostData) != 0 && string(p.HostData) != string(r.GetHostData()) {
		return 0, mismatch("HOST_DATA", p.HostData.String(), Hex(r.GetHostData()).String(),
			"the pod's init data differs from the one the VM was launched with")
	}
	if err := checkNonce(wantRD, r.GetReportData()); err != nil {
		return 0, err
	}
	if len(p.ChipID) != 0 && string(p.ChipID) != string(r.GetChipId()) {
		return 0, mismatch("CHIP_ID", p.ChipID.String(), Hex(r.GetChipId()).String(), "the VM runs on another machine")
	}
	if p.VMPL != nil && uint32(*p.VMPL) != r.GetVmpl() {
		return 0, mismatch("VMPL", fmt.Sprint(*p.VMPL), fmt.Sprint(r.GetVmpl()), "the report was requested at another privilege level")
	}
	return vcpus, nil
}

func tcbString(t kds.TCBParts) string {
	return fmt.Sprintf("bl=%d tee=%d snp=%d ucode=%d", t.BlSpl, t.TeeSpl, t.SnpSpl, t.UcodeSpl)
}
