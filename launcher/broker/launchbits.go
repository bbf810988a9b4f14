package broker

import (
	"fmt"

	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/launcher/attest"
)

// tdxLaunchFieldSize is the size of TD_ATTRIBUTES and XFAM.
const tdxLaunchFieldSize = 8

// validateLaunch checks the workload's launch bits: snp_guest_policy a
// guest policy to require (attest.ValidateSNPGuestPolicy), td_attributes
// and xfam 8 bytes each.
func (w *Workload) validateLaunch() error {
	if err := attest.ValidateSNPGuestPolicy(w.SNPGuestPolicy); err != nil {
		return err
	}
	if len(w.TDAttributes) != 0 && len(w.TDAttributes) != tdxLaunchFieldSize {
		return fmt.Errorf("td_attributes is %d bytes, want 8 (as in the quote, e.g. 0000001000000000: SEPT_VE_DISABLE)", len(w.TDAttributes))
	}
	if len(w.XFAM) != 0 && len(w.XFAM) != tdxLaunchFieldSize {
		return fmt.Errorf("xfam is %d bytes, want 8 (as in the quote)", len(w.XFAM))
	}
	return nil
}

// checkLaunch returns "" if a was launched as the workload's launch bits
// require, or what differs. A field for the other TEE refuses, as
// min_tcb does.
func (w *Workload) checkLaunch(a *Attested) string {
	tdx := a.TEE == kbsapi.TeeTDX
	if w.SNPGuestPolicy != 0 {
		if tdx {
			return "TEE tdx: the workload's snp_guest_policy is an SNP guest policy, give td_attributes instead"
		}
		if err := attest.CheckSNPRequiredPolicy(w.SNPGuestPolicy, a.GuestPolicy, a.PlatformInfo); err != nil {
			return fmt.Sprintf("%v: below the workload's snp_guest_policy %#x", err, w.SNPGuestPolicy)
		}
	}
	if len(w.TDAttributes) != 0 || len(w.XFAM) != 0 {
		if !tdx {
			return fmt.Sprintf("TEE %s: the workload's td_attributes and xfam are TDX launch attributes, give snp_guest_policy instead", a.TEE)
		}
		if err := attest.CheckTDXRequiredAttributes(w.TDAttributes, w.XFAM, a.TDAttributes, a.XFAM); err != nil {
			return fmt.Sprintf("%v: not the workload's td_attributes and xfam", err)
		}
	}
	return ""
}
