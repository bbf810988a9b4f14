// Package attest produces attestation evidence inside the guest: an SNP
// ATTESTATION_REPORT (with the extended report's certificate table where
// the host supplies one) or a TDX quote, with the caller's 64 bytes bound
// into REPORT_DATA.
//
// One small Provider per source. Detect picks the one of the TEE the VM
// was started as, which the launcher fixes on the measured kernel command
// line (c8s.tee, guest/api/teeparam): never the host-served sim port in an
// snp or tdx guest, and an error rather than no TEE when that TEE's device
// is missing. The sources are:
//
//   - configfs-tsm: /sys/kernel/config/tsm/report, the kernel's
//     TEE-neutral report interface (SNP and TDX guests on Linux 6.7+), through
//     github.com/google/go-configfs-tsm;
//   - sev-guest: the /dev/sev-guest ioctl device, through
//     github.com/google/go-sev-guest's client (extended report);
//   - tdx-guest: the /dev/tdx_guest ioctl device, through
//     github.com/google/go-tdx-guest's client (quote);
//   - sim: the simulated secure processor of the sim TEE, which the host
//     serves on the virtio-serial port c8s.attest (guest/api/attest/v1).
//
// Before that, StartedAs settles which TEE the guest was started as: the
// one c8s.tee names, once the hardware TEE the guest's kernel runs in
// (Hardware: SEV-SNP, TDX or neither) agrees. A guest in SNP or TDX
// hardware never runs as sim or as no TEE, one started as snp or tdx never
// runs without that hardware: PID 1 powers the VM off with the reason on
// its console (ErrHardwareMismatch).
//
// The guest only gathers evidence; verifying it is the host's business.
package attest

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"

	"github.com/google/go-sev-guest/abi"
)

// Evidence kinds.
const (
	KindSNP = "snp"
	KindTDX = "tdx"
)

// Provider names.
const (
	NameConfigfsTSM = "configfs-tsm"
	NameSEVGuest    = "sev-guest"
	NameTDXGuest    = "tdx-guest"
	NameSim         = "sim"
)

// Evidence is what a provider returns.
type Evidence struct {
	// Kind is KindSNP or KindTDX.
	Kind string
	// Provider is the name of the provider that produced it.
	Provider string
	// Report is the SNP ATTESTATION_REPORT (ABI layout) or the TDX quote.
	Report []byte
	// CertTable is the SNP extended report's certificate table (GUID
	// table), when the host supplies certificates; else empty.
	CertTable []byte
	// TDReport is, for TDX evidence, the TDREPORT the guest read from the
	// TDX module (TDG.MR.REPORT through the tdx-guest driver) for the same
	// report data: guest-private bytes the host can neither forge nor
	// replay, unlike the quote, which the host's quoting service returns.
	// The guest reads its own launch digests (MRCONFIGID) from it.
	TDReport []byte
	// EventLog is the measured-boot event log: for TDX evidence the CC
	// event log (CCELPath), for the sim TEE the simulated boot's log. The
	// guest passes it on uninterpreted; the verifier replays it.
	EventLog []byte
	// SimRTMRs is the sim TEE's RTMR statement (launcher/vm/tee/sim).
	SimRTMRs []byte
}

// Provider produces evidence with reportData in REPORT_DATA.
type Provider interface {
	Name() string
	Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error)
}

// snpReportDataOffset is where REPORT_DATA sits in an SNP
// ATTESTATION_REPORT (AMD SEV-SNP ABI, table "ATTESTATION_REPORT
// structure", offset 50h, 64 bytes).
const snpReportDataOffset = 0x50

// checkSNPReport checks that report is an SNP ATTESTATION_REPORT by size
// and carries reportData in REPORT_DATA. The host verifies everything
// else; this catches a provider that answered another request.
func checkSNPReport(report []byte, reportData [64]byte) error {
	if len(report) != abi.ReportSize {
		return fmt.Errorf("the SNP report is %d bytes, not the %d of an ATTESTATION_REPORT", len(report), abi.ReportSize)
	}
	got := report[snpReportDataOffset : snpReportDataOffset+len(reportData)]
	if !bytes.Equal(got, reportData[:]) {
		return fmt.Errorf("the SNP report's REPORT_DATA is %s, not the requested %s (a report for another request?)",
			hex.EncodeToString(got), hex.EncodeToString(reportData[:]))
	}
	return nil
}
