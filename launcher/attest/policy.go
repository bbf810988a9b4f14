package attest

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// Hex is a byte string that reads and writes itself as hex (JSON, TOML).
type Hex = verdict.Hex

// ParseHex decodes a hex string (an optional 0x prefix is allowed).
func ParseHex(s string) (Hex, error) { return verdict.ParseHex(s) }

// Policy is what one VM's evidence must show. The zero value of an
// optional field means "not checked"; the nonce and, for SNP, at least one
// measurement (for TDX an MRTD) are required. The Hex fields are the
// caller's slices, not copies: a slice of an array the caller reuses (a
// sim.Request's Measurement, say) changes the policy with it.
type Policy struct {
	// Measurements are the accepted SNP launch digests (48 bytes) by vCPU
	// count: one per vCPU shape the image may run with (image manifest or
	// c8s-measure).
	Measurements map[int]Hex `json:"measurements,omitempty"`
	// VCPUs is the vCPU count the VM was launched with; its measurement is
	// the only one accepted. Zero accepts any shape of Measurements.
	VCPUs int `json:"vcpus,omitempty"`
	// MinTCB is the minimum SNP TCB_VERSION (in the layout of the report's
	// product line: Turin's has an FMC level first), compared component by
	// component with the report's REPORTED_TCB. Zero means the product
	// line's default minimum (DefaultSNPMinTCB) for evidence chained to
	// AMD's roots, unless MinTCBExplicit.
	MinTCB uint64 `json:"min_tcb,omitempty"`
	// MinTCBExplicit makes MinTCB the minimum even when it is zero: the
	// policy explicitly accepts any TCB instead of the default minimum.
	MinTCBExplicit bool `json:"min_tcb_explicit,omitempty"`
	// AllowProvisionalFirmware accepts SNP evidence of firmware the host
	// has not committed to (COMMITTED_TCB or REPORTED_TCB below
	// CURRENT_TCB, or a committed firmware version below the current one),
	// as cloud hosts often run: the host can still roll the firmware back
	// to the committed level. Without it such evidence is refused.
	AllowProvisionalFirmware bool `json:"allow_provisional_firmware,omitempty"`
	// AllowDebug accepts guests launched with debugging enabled (SNP policy
	// bit 19, TDX TD_ATTRIBUTES.DEBUG). Never for production.
	AllowDebug bool `json:"allow_debug,omitempty"`
	// SNPGuestPolicy, when set, is an SNP guest policy (as
	// hypervisor.snp.policy and QEMU take it, e.g. 0x1830000) the report's
	// GUEST_POLICY must be at least as restrictive as: its ABI version at
	// least this one's, SMT only if this allows it, and each of
	// SINGLE_SOCKET, MEM_AES_256_XTS, RAPL_DIS, CIPHERTEXT_HIDING and
	// PAGE_SWAP_DISABLE this sets (CheckSNPRequiredPolicy). DEBUG is
	// AllowDebug's to decide; MIGRATE_MA and CXL_ALLOW are always refused.
	SNPGuestPolicy uint64 `json:"snp_guest_policy,omitempty"`
	// HostData is the expected SNP HOST_DATA (32 bytes): the digest of the
	// pod's init data. Empty, HOST_DATA must be zero (a pod without init
	// data), unless AnyHostData.
	HostData Hex `json:"host_data,omitempty"`
	// AnyHostData leaves an empty HostData unchecked: the caller compares
	// the verified claims' HOST_DATA itself (a broker pinning several init
	// data documents).
	AnyHostData bool `json:"any_host_data,omitempty"`
	// ChipID, when set, pins the SNP chip (64 bytes).
	ChipID Hex `json:"chip_id,omitempty"`
	// VMPL is the required SNP VMPL of the requester (0-3); unset, 0, the
	// level c8s guests request their reports at.
	VMPL *int `json:"vmpl,omitempty"`
	// MRTD is the expected TDX MRTD (48 bytes).
	MRTD Hex `json:"mrtd,omitempty"`
	// MRConfigID is the expected TDX MRCONFIGID (48 bytes): the init data
	// digest on TDX.
	MRConfigID Hex `json:"mrconfigid,omitempty"`
	// RTMRs are the expected TDX RTMR0-3 (48 bytes each); an empty entry is
	// not checked.
	RTMRs []Hex `json:"rtmrs,omitempty"`
	// TDXBoot, when set, is the measured boot the TD's CC event log must
	// show: the log is required, must replay to the quote's RTMRs, and its
	// RTMR1 and RTMR2 events must be exactly the kernel, command line and
	// initrd named here (TDXBoot). The sim TEE's modelled RTMRs are
	// checked the same way.
	TDXBoot *TDXBoot `json:"tdx_boot,omitempty"`
	// TDAttributes and XFAM, when set, are the exact TD_ATTRIBUTES and
	// XFAM (8 bytes each, as in the quote) the TD must have been launched
	// with: SEPT_VE_DISABLE, PKS, PERFMON and the extended CPU features.
	TDAttributes Hex `json:"td_attributes,omitempty"`
	XFAM         Hex `json:"xfam,omitempty"`
	// MinTEETCBSVN, when set, is the minimum TDX TEE_TCB_SVN (16 bytes),
	// compared byte by byte with the quote's. Unset, TEE_TCB_SVN is judged
	// only by the TCB status of Intel's collateral, when the verifier has
	// collateral.
	MinTEETCBSVN Hex `json:"min_tee_tcb_svn,omitempty"`
	// AllowTCBStatus names TCB statuses besides UpToDate that Intel's
	// collateral may give the platform, the TDX module or the quoting
	// enclave ("SWHardeningNeeded", "OutOfDate", …). Revoked is never
	// accepted.
	AllowTCBStatus []string `json:"allow_tcb_status,omitempty"`
	// Nonce is the verifier's fresh challenge (1-64 bytes); REPORT_DATA
	// must be the nonce followed by zeros.
	Nonce Hex `json:"nonce"`
}

// NonceSize is the size of the challenges NewNonce makes.
const NonceSize = verdict.NonceSize

// NewNonce returns a fresh random challenge for Policy.Nonce; the guest
// binds it into REPORT_DATA (followed by zeros).
func NewNonce() (Hex, error) { return verdict.NewNonce() }

// LoadPolicy reads a JSON policy file.
func LoadPolicy(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("attest: reading the policy: %w", err)
	}
	var p Policy
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("attest: policy %s: %w", path, err)
	}
	return &p, nil
}

const (
	snpMeasurementSize = 48
	snpHostDataSize    = 32
	snpChipIDSize      = 64
	reportDataSize     = 64
	tdxDigestSize      = 48
)

func configErr(format string, args ...any) *Error {
	return failure(KindConfig, "policy", fmt.Errorf(format, args...), "")
}

// reportData returns the REPORT_DATA the policy's nonce requires.
func (p *Policy) reportData() ([]byte, error) {
	if len(p.Nonce) == 0 {
		return nil, configErr("no nonce: evidence cannot be checked for freshness")
	}
	if len(p.Nonce) > reportDataSize {
		return nil, configErr("nonce is %d bytes, at most %d fit in REPORT_DATA", len(p.Nonce), reportDataSize)
	}
	rd := make([]byte, reportDataSize)
	copy(rd, p.Nonce)
	return rd, nil
}

func checkSize(name string, v Hex, size int) error {
	if len(v) != 0 && len(v) != size {
		return configErr("%s is %d bytes, expected %d", name, len(v), size)
	}
	return nil
}

// checkSNP validates the SNP part of the policy.
func (p *Policy) checkSNP() error {
	if len(p.Measurements) == 0 {
		return configErr("no expected measurement")
	}
	for n, m := range p.Measurements {
		if n < 1 {
			return configErr("measurement for vCPUs=%d: vCPU counts start at 1", n)
		}
		if len(m) != snpMeasurementSize {
			return configErr("measurement for vCPUs=%d is %d bytes, expected %d", n, len(m), snpMeasurementSize)
		}
	}
	if p.VCPUs != 0 {
		if _, ok := p.Measurements[p.VCPUs]; !ok {
			return configErr("no measurement for the launched shape vCPUs=%d (the policy has %s)", p.VCPUs, p.shapes())
		}
	}
	if p.VMPL != nil && (*p.VMPL < 0 || *p.VMPL > 3) {
		return configErr("vmpl %d: must be 0-3", *p.VMPL)
	}
	return errors.Join(checkSize("host_data", p.HostData, snpHostDataSize), checkSize("chip_id", p.ChipID, snpChipIDSize),
		ValidateSNPGuestPolicy(p.SNPGuestPolicy))
}

// checkTDX validates the TDX part of the policy.
func (p *Policy) checkTDX() error {
	if len(p.MRTD) == 0 {
		return configErr("no expected MRTD")
	}
	if len(p.RTMRs) > 4 {
		return configErr("%d RTMRs, TDX has 4", len(p.RTMRs))
	}
	errs := []error{checkSize("mrtd", p.MRTD, tdxDigestSize), checkSize("mrconfigid", p.MRConfigID, tdxDigestSize),
		checkSize("min_tee_tcb_svn", p.MinTEETCBSVN, tdxTEETCBSVNSize), p.TDXBoot.check(), checkTCBStatuses(p.AllowTCBStatus),
		checkSize("td_attributes", p.TDAttributes, tdxLaunchFieldSize), checkSize("xfam", p.XFAM, tdxLaunchFieldSize)}
	for i, r := range p.RTMRs {
		errs = append(errs, checkSize("rtmrs["+strconv.Itoa(i)+"]", r, tdxDigestSize))
	}
	return errors.Join(errs...)
}

// shapes lists the policy's vCPU shapes, for messages.
func (p *Policy) shapes() string {
	var s []string
	for _, n := range slices.Sorted(maps.Keys(p.Measurements)) {
		s = append(s, "vCPUs="+strconv.Itoa(n))
	}
	return strings.Join(s, ", ")
}

// matchMeasurement returns the vCPU shape whose measurement got is, or an
// error naming the expected value and the likely cause.
func (p *Policy) matchMeasurement(got []byte) (int, error) {
	if p.VCPUs != 0 {
		want := p.Measurements[p.VCPUs]
		if string(want) == string(got) {
			return p.VCPUs, nil
		}
		for n, m := range p.Measurements {
			if string(m) == string(got) {
				return 0, mismatch("measurement", want.String(), Hex(got).String(),
					fmt.Sprintf("vCPUs=%d; this is the measurement of the vCPUs=%d shape: the VM did not run with the vCPU count it was launched for", p.VCPUs, n))
			}
		}
		return 0, mismatch("measurement", want.String(), Hex(got).String(),
			fmt.Sprintf("vCPUs=%d; the firmware, kernel, initrd or command line differs from the manifest?", p.VCPUs))
	}
	for n, m := range p.Measurements {
		if string(m) == string(got) {
			return n, nil
		}
	}
	var want []string
	for _, n := range slices.Sorted(maps.Keys(p.Measurements)) {
		want = append(want, fmt.Sprintf("%s (vCPUs=%d)", p.Measurements[n], n))
	}
	return 0, mismatch("measurement", "one of "+strings.Join(want, ", "), Hex(got).String(),
		"the firmware, kernel, initrd or command line differs from the manifest, or the VM runs a vCPU count the policy does not accept?")
}

// checkNonce compares REPORT_DATA with the policy's nonce.
func checkNonce(want, got []byte) error {
	if string(want) == string(got) {
		return nil
	}
	return mismatch("REPORT_DATA (nonce)", Hex(want).String(), Hex(got).String(),
		"the evidence is not fresh: a replayed report, or one produced for another challenge")
}
