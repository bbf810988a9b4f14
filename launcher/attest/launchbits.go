package attest

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/google/go-sev-guest/abi"
)

// The launch bits: what the host chose when it launched the VM, outside
// the launch measurement but signed into the evidence. An SNP report's
// GUEST_POLICY (and the PLATFORM_INFO the firmware reports beside it) and
// a TDX quote's TD_ATTRIBUTES and XFAM. DEBUG, MIGRATE_MA, CXL_ALLOW and
// MIGRATABLE are judged for every VM; the rest only where the policy pins
// them (SNPGuestPolicy, TDAttributes, XFAM).

// SNP guest policy bits (SEV-SNP firmware ABI, GUEST_POLICY).
const (
	snpPolicyABIMinor         = 0xff
	snpPolicyABIMajor         = 0xff << 8
	snpPolicySMT              = 1 << 16
	snpPolicyReserved1        = 1 << 17 // must be one
	snpPolicyMigrateMA        = 1 << 18
	snpPolicyDebug            = 1 << 19
	snpPolicySingleSocket     = 1 << 20
	snpPolicyCXLAllow         = 1 << 21
	snpPolicyMemAES256XTS     = 1 << 22
	snpPolicyRAPLDis          = 1 << 23
	snpPolicyCiphertextHiding = 1 << 24
	snpPolicyPageSwapDisable  = 1 << 25
	snpPolicyKnown            = 1<<26 - 1
)

// PLATFORM_INFO bits of an SNP report.
const (
	snpPlatformSMTEnabled       = 1 << 0
	snpPlatformRAPLDisabled     = 1 << 3
	snpPlatformCiphertextHiding = 1 << 4
)

// snpRestrictions are the guest policy bits that narrow what the guest
// accepts: a required one must be set in the report's policy, and, for
// those the platform reports too, be in force on the platform.
var snpRestrictions = []struct {
	bit      uint64
	name     string
	platform uint64 // PLATFORM_INFO bit that must be set with it; 0: none
	hint     string
}{
	{snpPolicySingleSocket, "SINGLE_SOCKET", 0, "the guest may run across sockets"},
	{snpPolicyMemAES256XTS, "MEM_AES_256_XTS", 0, "the guest's memory may be encrypted with AES-128 instead of AES-256-XTS"},
	{snpPolicyRAPLDis, "RAPL_DIS", snpPlatformRAPLDisabled, "the platform's power reporting (RAPL), a side channel, may be on"},
	{snpPolicyCiphertextHiding, "CIPHERTEXT_HIDING", snpPlatformCiphertextHiding, "the host may read the guest's memory ciphertext, a side channel"},
	{snpPolicyPageSwapDisable, "PAGE_SWAP_DISABLE", 0, "the host may swap the guest's pages out and back in (SNP_PAGE_SWAP_OUT, SNP_PAGE_SWAP_IN)"},
}

// tdAttributesDebug is TD_ATTRIBUTES bit 0 (byte 0): the TD is
// debuggable; tdAttributesMigratable bit 29 (byte 3).
const (
	tdAttributesDebug      = 0x01
	tdAttributesMigratable = 0x20 // of byte 3
	tdxLaunchFieldSize     = 8    // TD_ATTRIBUTES, XFAM
)

// ValidateSNPGuestPolicy validates a guest policy to require
// (Policy.SNPGuestPolicy; 0 requires nothing): one as QEMU's
// sev-snp-guest takes it. Bits c8s always refuses in
// evidence make no sense there, and reserved bits are refused so that a
// value is never read as weaker than it was meant.
func ValidateSNPGuestPolicy(v uint64) error {
	switch {
	case v == 0:
		return nil
	case v&snpPolicyReserved1 == 0:
		return configErr("snp_guest_policy %#x lacks bit 17, which every SNP guest policy sets (e.g. 0x30000: SMT allowed; 0x20000: no SMT)", v)
	case v&^snpPolicyKnown != 0:
		return configErr("snp_guest_policy %#x sets reserved bits %#x", v, v&^snpPolicyKnown)
	case v&snpPolicyDebug != 0:
		return configErr("snp_guest_policy %#x sets DEBUG (bit 19): allow_debug decides on debug guests", v)
	case v&(snpPolicyMigrateMA|snpPolicyCXLAllow) != 0:
		return configErr("snp_guest_policy %#x sets MIGRATE_MA or CXL_ALLOW, which c8s refuses in every report", v)
	}
	return nil
}

// checkSNPLaunchPolicy judges the report's GUEST_POLICY and PLATFORM_INFO:
// DEBUG unless the policy allows it, MIGRATE_MA and CXL_ALLOW never, and,
// where the policy pins a guest policy, a report's at least as
// restrictive (go-sev-guest's rule).
func checkSNPLaunchPolicy(policy, platformInfo uint64, p *Policy) error {
	bitErr := func(name string, expected, actual uint64, hint string) *Error {
		return &Error{Kind: KindPolicy, Field: "guest policy " + name + " bit", Expected: fmt.Sprint(expected),
			Actual: fmt.Sprintf("%d (POLICY=%#x)", actual, policy), Hint: hint}
	}
	if policy&snpPolicyDebug != 0 && !p.AllowDebug {
		return bitErr("DEBUG", 0, 1, "the VM was launched with debugging allowed, so the host can read its memory; the policy forbids debug guests")
	}
	// What go-sev-guest's validation refuses where it can read the
	// evidence (Milan, Genoa), refused here for every product line: the
	// policy is the host's choice at launch, outside the measurement.
	if policy&snpPolicyMigrateMA != 0 {
		return bitErr("MIGRATE_MA", 0, 1, "the VM was launched to accept a migration agent, which the host chooses and which can export the guest's memory; c8s never launches one")
	}
	if policy&snpPolicyCXLAllow != 0 {
		return bitErr("CXL_ALLOW", 0, 1, "the VM was launched to accept CXL devices or memory; c8s never launches one so")
	}
	return CheckSNPRequiredPolicy(p.SNPGuestPolicy, policy, platformInfo)
}

// CheckSNPRequiredPolicy reports whether an SNP report's GUEST_POLICY
// and PLATFORM_INFO are at least as restrictive as required (a
// snp_guest_policy; 0 requires nothing): an ABI version at least
// required's, SMT only if required allows it (and then PLATFORM_INFO
// must show SMT off too), and each of SINGLE_SOCKET, MEM_AES_256_XTS,
// RAPL_DIS, CIPHERTEXT_HIDING and PAGE_SWAP_DISABLE that required sets
// (RAPL_DIS and CIPHERTEXT_HIDING also in force in PLATFORM_INFO). It
// returns an *Error (KindPolicy).
func CheckSNPRequiredPolicy(required, policy, platformInfo uint64) error {
	if required == 0 {
		return nil
	}
	abiOf := func(v uint64) (uint64, uint64) { return (v & snpPolicyABIMajor) >> 8, v & snpPolicyABIMinor }
	if wm, wn := abiOf(required); wm != 0 || wn != 0 {
		if gm, gn := abiOf(policy); gm < wm || (gm == wm && gn < wn) {
			return &Error{Kind: KindPolicy, Field: "guest policy ABI version", Expected: fmt.Sprintf("at least %d.%d", wm, wn),
				Actual: fmt.Sprintf("%d.%d (POLICY=%#x)", gm, gn, policy),
				Hint:   "the VM was launched accepting older SEV-SNP firmware than the workload requires: launch with hypervisor.snp.policy naming the ABI version"}
		}
	}
	if required&snpPolicySMT == 0 {
		if policy&snpPolicySMT != 0 {
			return &Error{Kind: KindPolicy, Field: "guest policy SMT bit", Expected: "0", Actual: fmt.Sprintf("1 (POLICY=%#x)", policy),
				Hint: "the VM was launched allowing SMT, so a sibling hyperthread of the host's may share its core; launch with hypervisor.snp.policy without bit 16 on a host with SMT off"}
		}
		if platformInfo&snpPlatformSMTEnabled != 0 {
			return &Error{Kind: KindPolicy, Field: "PLATFORM_INFO SMT_EN bit", Expected: "0", Actual: fmt.Sprintf("1 (PLATFORM_INFO=%#x)", platformInfo),
				Hint: "the platform runs with SMT on, which the required guest policy forbids"}
		}
	}
	var missing []string
	hint := ""
	for _, r := range snpRestrictions {
		if required&r.bit == 0 {
			continue
		}
		if policy&r.bit == 0 {
			missing = append(missing, r.name)
			if hint == "" {
				hint = "without " + r.name + " " + r.hint
			}
			continue
		}
		if r.platform != 0 && platformInfo&r.platform == 0 {
			return &Error{Kind: KindPolicy, Field: "PLATFORM_INFO " + r.name, Expected: "in force", Actual: fmt.Sprintf("off (PLATFORM_INFO=%#x)", platformInfo),
				Hint: "the guest policy asks for " + r.name + " but the platform reports it is not in force"}
		}
	}
	if len(missing) > 0 {
		return &Error{Kind: KindPolicy, Field: "guest policy", Expected: fmt.Sprintf("%s set (required %#x)", strings.Join(missing, ", "), required),
			Actual: fmt.Sprintf("POLICY=%#x", policy), Hint: hint + "; launch with hypervisor.snp.policy setting the workload's bits"}
	}
	return nil
}

// checkTDXLaunchAttributes judges the quote's TD_ATTRIBUTES and XFAM:
// DEBUG unless the policy allows it, MIGRATABLE never, and each exactly as
// the policy pins it.
func checkTDXLaunchAttributes(attrs, xfam []byte, p *Policy) error {
	if len(attrs) > 0 && attrs[0]&tdAttributesDebug != 0 && !p.AllowDebug {
		return &Error{Kind: KindPolicy, Field: "TD_ATTRIBUTES DEBUG bit", Expected: "0", Actual: "1 (TD_ATTRIBUTES=" + Hex(attrs).String() + ")",
			Hint: "the TD is debuggable, so the host can read its memory; the policy forbids debug guests"}
	}
	if len(attrs) > 3 && attrs[3]&tdAttributesMigratable != 0 {
		return &Error{Kind: KindPolicy, Field: "TD_ATTRIBUTES MIGRATABLE bit", Expected: "0", Actual: "1 (TD_ATTRIBUTES=" + Hex(attrs).String() + ")",
			Hint: "the TD was launched migratable: a migration TD the host binds can export its memory; c8s never launches one"}
	}
	return CheckTDXRequiredAttributes(p.TDAttributes, p.XFAM, attrs, xfam)
}

// CheckTDXRequiredAttributes reports whether a quote's TD_ATTRIBUTES and
// XFAM are exactly the pinned ones (8 bytes each, as in the quote; empty
// pins nothing). It returns an *Error (KindMismatch).
func CheckTDXRequiredAttributes(wantAttrs, wantXFAM, attrs, xfam []byte) error {
	if len(wantAttrs) != 0 && string(wantAttrs) != string(attrs) {
		return mismatch("TD_ATTRIBUTES", Hex(wantAttrs).String(), Hex(attrs).String(), tdAttributesHint(wantAttrs, attrs))
	}
	if len(wantXFAM) != 0 && string(wantXFAM) != string(xfam) {
		return mismatch("XFAM", Hex(wantXFAM).String(), Hex(xfam).String(),
			"the TD was launched with other extended CPU features (QEMU's -cpu model decides XFAM)")
	}
	return nil
}

// tdAttributesHint names the TD_ATTRIBUTES bits that differ.
func tdAttributesHint(want, got []byte) string {
	if len(want) != tdxLaunchFieldSize || len(got) != tdxLaunchFieldSize {
		return "TD_ATTRIBUTES is 8 bytes"
	}
	names := map[int]string{0: "DEBUG", 28: "SEPT_VE_DISABLE", 29: "MIGRATABLE", 30: "PKS", 31: "KL", 63: "PERFMON"}
	diff := binary.LittleEndian.Uint64(want) ^ binary.LittleEndian.Uint64(got)
	var bits []string
	for i := range 64 {
		if diff&(1<<i) == 0 {
			continue
		}
		n := names[i]
		if n == "" {
			n = fmt.Sprintf("bit %d", i)
		}
		state := "clear"
		if binary.LittleEndian.Uint64(got)&(1<<i) != 0 {
			state = "set"
		}
		bits = append(bits, n+" "+state)
	}
	return "the TD was launched with other attributes: " + strings.Join(bits, ", ") + " (QEMU's tdx-guest sept-ve-disable and the -cpu model's pks and pmu decide them)"
}

// snpGuestPolicy is the guest policy go-sev-guest's validation (the
// second opinion) requires: the pinned one, or none but SMT allowed, with
// DEBUG as AllowDebug says.
func (p *Policy) snpGuestPolicy() abi.SnpPolicy {
	if p.SNPGuestPolicy == 0 {
		return abi.SnpPolicy{Debug: p.AllowDebug, SMT: true}
	}
	sp, err := abi.ParseSnpPolicy(p.SNPGuestPolicy)
	if err != nil { // ValidateSNPGuestPolicy refused it already
		return abi.SnpPolicy{Debug: p.AllowDebug}
	}
	sp.Debug = p.AllowDebug
	return sp
}
