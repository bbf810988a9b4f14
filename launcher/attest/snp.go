package attest

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/validate"

	"github.com/c8s-dev/c8s/launcher/attest/snpext"
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// SNPClaims are the verified contents of an SNP report (verdict.SNPClaims).
type SNPClaims = verdict.SNPClaims

// VerifySNP verifies an SEV-SNP ATTESTATION_REPORT (abi.ReportSize bytes)
// and the certificate table that came with it (GUID table, as an extended
// report request returns it; it may be empty when FetchCertificates is
// set) against p. Trust anchors come from the verifier, never from the
// table: the VCEK or VLEK in the table must chain to the verifier's ASK or
// ASVK and ARK of the report's product line.
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
	e, err := v.verifySNPEndorsement(report, att)
	if err != nil {
		return nil, err
	}
	r := att.GetReport()
	vcpus, err := checkSNPFields(r, p, wantRD)
	if err != nil {
		return nil, err
	}
	if err := v.checkSNPTCB(r, e, p); err != nil {
		return nil, err
	}
	if e.upstream {
		// go-sev-guest's validation, with the same expectations, as a
		// second opinion where it can read the evidence.
		min, _, _ := v.minTCB(p, r, e.line) // checked by checkSNPTCB
		vmpl := p.vmpl()
		if err := validate.SnpAttestation(att, &validate.Options{
			GuestPolicy:               p.snpGuestPolicy(),
			Measurement:               p.Measurements[vcpus],
			HostData:                  p.expectedHostData(),
			ReportData:                wantRD,
			ChipID:                    p.ChipID,
			MinimumTCB:                kds.DecomposeTCBVersion(kds.TCBVersion(min.Raw())),
			MinimumLaunchTCB:          kds.DecomposeTCBVersion(kds.TCBVersion(min.Raw())),
			VMPL:                      &vmpl,
			PermitProvisionalFirmware: p.AllowProvisionalFirmware,
		}); err != nil {
			return nil, failure(KindPolicy, "report validation (go-sev-guest)", err, "")
		}
	}
	reported := snpext.DecomposeTCB(r.GetReportedTcb(), e.line)
	return &SNPClaims{
		Mode:          v.trust.Mode,
		Simulated:     v.trust.Mode == ModeSim,
		ReportVersion: r.GetVersion(),
		ProductLine:   e.line,
		SigningKey:    string(e.key),
		VCPUs:         vcpus,
		Measurement:   r.GetMeasurement(),
		HostData:      r.GetHostData(),
		ReportData:    r.GetReportData(),
		ChipID:        r.GetChipId(),
		ReportedTCB:   r.GetReportedTcb(),
		LaunchTCB:     r.GetLaunchTcb(),
		TCB:           reported.String(),
		Provisional:   r.GetCommittedTcb() != r.GetCurrentTcb() || r.GetReportedTcb() != r.GetCurrentTcb(),
		GuestPolicy:   r.GetPolicy(),
		PlatformInfo:  r.GetPlatformInfo(),
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

// checkSNPFields applies the policy to the report's fields and returns the
// matched vCPU shape.
func checkSNPFields(r *spb.Report, p *Policy, wantRD []byte) (int, error) {
	if err := checkSNPLaunchPolicy(r.GetPolicy(), r.GetPlatformInfo(), p); err != nil {
		return 0, err
	}
	vcpus, err := p.matchMeasurement(r.GetMeasurement())
	if err != nil {
		return 0, err
	}
	if want := p.expectedHostData(); want != nil && string(want) != string(r.GetHostData()) {
		hint := "the pod's init data differs from the one the VM was launched with"
		if len(p.HostData) == 0 {
			hint = "the pod has no init data, so its VM is launched with HOST_DATA zero; this one was launched with other data"
		}
		return 0, mismatch("HOST_DATA", Hex(want).String(), Hex(r.GetHostData()).String(), hint)
	}
	if err := checkNonce(wantRD, r.GetReportData()); err != nil {
		return 0, err
	}
	if len(p.ChipID) != 0 && string(p.ChipID) != string(r.GetChipId()) {
		return 0, mismatch("CHIP_ID", p.ChipID.String(), Hex(r.GetChipId()).String(), "the VM runs on another machine")
	}
	if want := p.vmpl(); uint32(want) != r.GetVmpl() {
		hint := "the report was requested at another privilege level"
		if p.VMPL == nil {
			hint = "a c8s guest requests its report at VMPL 0; evidence from another privilege level (an SVSM, a paravisor's guest) needs the policy's vmpl"
		}
		return 0, mismatch("VMPL", fmt.Sprint(want), fmt.Sprint(r.GetVmpl()), hint)
	}
	return vcpus, nil
}

// checkChipID compares a VCEK-signed report's CHIP_ID with the VCEK's
// HWID (64 bytes before Turin; on Turin the 8-byte HWID, zero-extended).
// A masked CHIP_ID (zero) is not compared; a VLEK has no HWID.
func checkChipID(r *spb.Report, e *snpEndorsement) error {
	chip := r.GetChipId()
	if e.key != snpext.VCEK || allZero(chip) {
		return nil
	}
	hwid := e.exts.HWID
	if len(chip) < len(hwid) || string(chip[:len(hwid)]) != string(hwid) || !allZero(chip[len(hwid):]) {
		return mismatch("CHIP_ID", Hex(hwid).String()+" (the VCEK's HWID)", Hex(chip).String(),
			"the VCEK is another chip's: the host sent the certificate of another machine")
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
