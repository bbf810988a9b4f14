// Package verdict is what a verification of a pod VM's evidence decides,
// in a form that crosses a process boundary: the verified claims
// (SNPClaims, TDXClaims) or the typed failure (*Error, naming the field,
// the expected and the actual value and a hint), and the protocol of
// `c8s-verify verify-evidence`, the short-lived process the shim has
// evidence verified in (Request on its stdin, Verdict on its stdout).
//
// It holds the types only, and imports nothing but the standard library,
// so that a process can read verdicts without linking the verifiers
// (launcher/attest: go-sev-guest, go-tdx-guest, x509 chains, CRLs, Intel's
// collateral). launcher/attest defines its claims and errors as these
// types (type aliases): an *attest.Error the helper returned is, once
// decoded, an *attest.Error in the caller too, with the same text.
package verdict

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// Hex is a byte string that reads and writes itself as hex (JSON, TOML).
type Hex []byte

// ParseHex decodes a hex string (an optional 0x prefix is allowed).
func ParseHex(s string) (Hex, error) {
	b, err := hex.DecodeString(strings.TrimPrefix(strings.TrimSpace(s), "0x"))
	if err != nil {
		return nil, fmt.Errorf("not a hex string: %q", s)
	}
	return b, nil
}

func (h Hex) String() string { return hex.EncodeToString(h) }

// MarshalText encodes h as lower-case hex.
func (h Hex) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText decodes hex.
func (h *Hex) UnmarshalText(b []byte) error {
	v, err := ParseHex(string(b))
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// Mode is the TEE whose evidence a verifier accepts.
type Mode string

const (
	// ModeSNP trusts AMD's roots (embedded in go-sev-guest) only.
	ModeSNP Mode = "snp"
	// ModeTDX trusts Intel's SGX/TDX root (embedded in go-tdx-guest) only.
	ModeTDX Mode = "tdx"
	// ModeSim trusts the node's simulated secure processor only: SNP-format
	// reports signed by a c8s simulated (test-only) chain.
	ModeSim Mode = "sim"
)

// SNPClaims are the verified contents of an SNP report.
type SNPClaims struct {
	Mode          Mode   `json:"mode"`
	Simulated     bool   `json:"simulated"`
	ReportVersion uint32 `json:"report_version"`
	// ProductLine is the AMD product line the report comes from (Milan,
	// Genoa — Siena and Bergamo included —, Turin).
	ProductLine string `json:"product_line"`
	// SigningKey is VCEK or VLEK.
	SigningKey  string `json:"signing_key"`
	VCPUs       int    `json:"vcpus"`
	Measurement Hex    `json:"measurement"`
	HostData    Hex    `json:"host_data"`
	ReportData  Hex    `json:"report_data"`
	ChipID      Hex    `json:"chip_id"`
	ReportedTCB uint64 `json:"reported_tcb"`
	// LaunchTCB is the TCB the guest was launched under (LAUNCH_TCB),
	// in the same layout.
	LaunchTCB uint64 `json:"launch_tcb"`
	// TCB is REPORTED_TCB decomposed in the product line's layout
	// ("fmc=0 bl=1 tee=0 snp=2 ucode=71" on Turin).
	TCB string `json:"tcb"`
	// Provisional: the firmware runs above its committed level (accepted
	// only with allow_provisional_firmware).
	Provisional bool   `json:"provisional,omitempty"`
	GuestPolicy uint64 `json:"guest_policy"`
	// PlatformInfo is the report's PLATFORM_INFO (SMT, TSME, RAPL and
	// ciphertext hiding in force on the platform).
	PlatformInfo uint64 `json:"platform_info"`
	VMPL         uint32 `json:"vmpl"`
}

// TDXClaims are the verified contents of a TDX quote.
type TDXClaims struct {
	Mode         Mode   `json:"mode"`
	QuoteVersion uint32 `json:"quote_version"`
	MRTD         Hex    `json:"mrtd"`
	MRConfigID   Hex    `json:"mrconfigid"`
	RTMRs        []Hex  `json:"rtmrs"`
	TDAttributes Hex    `json:"td_attributes"`
	XFAM         Hex    `json:"xfam"`
	TeeTCBSVN    Hex    `json:"tee_tcb_svn"`
	ReportData   Hex    `json:"report_data"`
	// TDReport is the TD report's version in a v5 quote ("1.0" or "1.5";
	// empty for v4, whose body is 1.0); TeeTCBSVN2 and MRServiceTD are a
	// TD report 1.5's (MRSERVICETD is always zero: a bound service TD is
	// refused).
	TDReport    string `json:"td_report,omitempty"`
	TeeTCBSVN2  Hex    `json:"tee_tcb_svn2,omitempty"`
	MRServiceTD Hex    `json:"mrservicetd,omitempty"`
	// EventLogReplayed says the CC event log replayed to the RTMRs (and,
	// under a policy with TDXBoot, named the manifest's boot).
	EventLogReplayed bool `json:"event_log_replayed"`
	// TCB is the verdict of Intel's collateral; nil when the verifier had
	// none (Trust.TDXCollateral, Trust.FetchCertificates).
	TCB *TDXTCB `json:"tcb,omitempty"`
}

// TDXTCB is the verdict of Intel's collateral on a platform.
type TDXTCB struct {
	FMSPC string `json:"fmspc"`
	// Status is the platform's TCB status (TCB info level matched by the
	// PCK certificate's CPUSVN and PCESVN and the quote's TEE_TCB_SVN).
	Status string `json:"status"`
	// ModuleStatus is the TDX module's status, when TCB info judges it.
	ModuleStatus string `json:"module_status,omitempty"`
	// QEStatus is the quoting enclave's status (QE identity).
	QEStatus string `json:"qe_status"`
	// TCBDate is the date of the matched TCB level.
	TCBDate string `json:"tcb_date,omitempty"`
	// Advisories are the matched level's Intel security advisories.
	Advisories []string `json:"advisories,omitempty"`
	// EvaluationDataNumber is TCB info's tcbEvaluationDataNumber.
	EvaluationDataNumber int `json:"tcb_evaluation_data_number"`
}
