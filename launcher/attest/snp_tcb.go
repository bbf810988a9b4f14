package attest

import (
	"fmt"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"

	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

// defaultSNPMinTCB is the minimum REPORTED_TCB of evidence chained to
// AMD's genuine roots when a policy sets no min_tcb, per product line (and
// for the Genoa line's Zen 4c processors apart, genoaZen4c). The values
// and their sources (README, "SNP minimum TCB"):
//   - Milan: bl=3 tee=0 snp=8 ucode=115, the default minimum Edgeless
//     Systems ships in Contrast and Constellation (the Milan TCB after the
//     firmware of AMD-SB-3005, 2023);
//   - Genoa: bl=10 tee=0 snp=23 ucode=84, the lowest Genoa TCB AMD's KDS
//     certified among the public genuine reports c8s tests with that run
//     SEV firmware 1.55.40 or later (Azure, January 2025);
//   - Genoa-line Zen 4c (Siena, Bergamo: CPUID model A0h-AFh): the Genoa
//     line's SEV firmware levels (bl=10 tee=0 snp=23: the genuine Siena
//     report's bl=10 snp=27 at firmware 1.55.49 continue Genoa's snp=23 at
//     1.55.40 and 25 at 1.55.43) and ucode=27, the microcode level of the
//     only public genuine Siena report (testdata/snp/siena-v5-lunal):
//     microcode security patch levels are numbered per processor model,
//     and that report's 27 is far below Genoa's floor of 84 (a version 2
//     report names no model: Genoa's default applies to it);
//   - Turin: fmc=0 bl=1 tee=0 snp=2 ucode=71, the TCB of the only public
//     genuine Turin report (firmware 1.55.61, July 2025).
//
// They are floors against long-fixed firmware, not the levels of AMD's
// latest bulletins (AMD-SB-3019, AMD-SB-7029): an owner raises them with
// min_tcb to what AMD's current bulletins require, or lowers them
// explicitly (min_tcb, min_tcb_explicit).
var defaultSNPMinTCB = map[string]snpext.TCB{
	snpext.Milan: {Line: snpext.Milan, Bootloader: 3, TEE: 0, SNP: 8, Microcode: 115},
	snpext.Genoa: {Line: snpext.Genoa, Bootloader: 10, TEE: 0, SNP: 23, Microcode: 84},
	genoaZen4c:   {Line: snpext.Genoa, Bootloader: 10, TEE: 0, SNP: 23, Microcode: 27},
	snpext.Turin: {Line: snpext.Turin, FMC: 0, Bootloader: 1, TEE: 0, SNP: 2, Microcode: 71},
}

// genoaZen4c is the defaultSNPMinTCB key of the Genoa line's Zen 4c
// processors, Siena and Bergamo (CPUID family 19h, models A0h-AFh), whose
// microcode levels are not Genoa's.
const genoaZen4c = "Genoa-line Zen 4c (Siena, Bergamo)"

// DefaultSNPMinTCB returns the default minimum TCB of productLine's
// evidence (chained to AMD's roots, with no min_tcb in the policy), as a
// TCB_VERSION in that line's layout. For the Genoa line it is Genoa's
// (CPUID models 10h-1Fh); DefaultSNPMinTCBFor tells Siena and Bergamo
// apart.
func DefaultSNPMinTCB(productLine string) (uint64, bool) {
	t, ok := defaultSNPMinTCB[productLine]
	return t.Raw(), ok
}

// DefaultSNPMinTCBFor returns the default minimum TCB of evidence from the
// processor of CPUID family and model (as a version 3 or later report
// carries them), and the name of the processors it applies to.
func DefaultSNPMinTCBFor(family, model uint8) (raw uint64, applies string, ok bool) {
	line, err := snpext.ProductLine(snpext.CPUID{Family: family, Model: model})
	if err != nil {
		return 0, "", false
	}
	key := snpMinTCBKey(line, family, model)
	d, ok := defaultSNPMinTCB[key]
	return d.Raw(), key, ok
}

// snpMinTCBKey is the defaultSNPMinTCB key of a processor of line and
// CPUID family and model (0, 0 for a version 2 report, which carries none:
// its line's key).
func snpMinTCBKey(line string, family, model uint8) string {
	if line == snpext.Genoa && family == 0x19 && model >= 0xA0 && model <= 0xAF {
		return genoaZen4c
	}
	return line
}

// minTCB is the minimum the policy requires of a report's REPORTED_TCB
// and LAUNCH_TCB, for a report of line, and where it comes from. A
// min_tcb is a TCB_VERSION in one product line's layout: one with bits
// set that line's layout reserves was written for another line (a Milan
// or Genoa snp level sits in a byte Turin reserves), and is refused
// rather than read as levels it does not state.
func (v *Verifier) minTCB(p *Policy, r *spb.Report, line string) (snpext.TCB, string, error) {
	if p.MinTCB != 0 || p.MinTCBExplicit {
		if bits := snpext.ReservedBits(p.MinTCB, line); bits != 0 {
			return snpext.TCB{}, "", &Error{Kind: KindConfig, Field: "min_tcb", Expected: "a " + line + " TCB_VERSION (the report's product line)",
				Actual: fmt.Sprintf("%#016x: bits %#x are reserved in the %s layout", p.MinTCB, bits, line),
				Hint:   "the minimum was written in another product line's layout (Milan and Genoa: bl, tee, snp in byte 6, ucode; Turin: fmc, bl, tee, snp in byte 3, ucode): verify each line's evidence with its own min_tcb"}
		}
		return snpext.DecomposeTCB(p.MinTCB, line), "the policy's min_tcb", nil
	}
	var family, model uint8
	if r.GetVersion() >= 3 {
		family, model, _ = abi.FmsFromCpuid1Eax(r.GetCpuid1EaxFms())
	}
	key := snpMinTCBKey(line, family, model)
	if d, ok := defaultSNPMinTCB[key]; ok && v.usesAMDRoots() {
		return d, "c8s's default minimum for " + key + " (a policy sets another with min_tcb)", nil
	}
	return snpext.TCB{Line: line}, "none", nil
}

// checkSNPTCB checks the report's TCB fields against its key certificate
// and the policy: REPORTED_TCB is the TCB the key is certified for, the
// firmware runs (CURRENT_TCB) what it committed to (COMMITTED_TCB) and
// reports, unless the policy allows provisional firmware, and
// REPORTED_TCB and LAUNCH_TCB meet the minimum.
func (v *Verifier) checkSNPTCB(r *spb.Report, e *snpEndorsement, p *Policy) error {
	line := e.line
	for _, f := range []struct {
		name string
		raw  uint64
	}{{"REPORTED_TCB", r.GetReportedTcb()}, {"CURRENT_TCB", r.GetCurrentTcb()}, {"COMMITTED_TCB", r.GetCommittedTcb()}, {"LAUNCH_TCB", r.GetLaunchTcb()}} {
		if bits := snpext.ReservedBits(f.raw, line); bits != 0 {
			return &Error{Kind: KindFormat, Field: f.name, Actual: fmt.Sprintf("%#016x", f.raw),
				Hint: fmt.Sprintf("bits %#x are reserved in the %s TCB layout", bits, line)}
		}
	}
	reported := snpext.DecomposeTCB(r.GetReportedTcb(), line)
	current := snpext.DecomposeTCB(r.GetCurrentTcb(), line)
	committed := snpext.DecomposeTCB(r.GetCommittedTcb(), line)
	if !reported.Equal(e.exts.TCB) {
		return mismatch("REPORTED_TCB", e.exts.TCB.String()+" (the "+string(e.key)+"'s)", reported.String(),
			fmt.Sprintf("the %s is certified for another TCB: the host sent the certificate of another firmware level", e.key))
	}
	if !current.AtLeast(committed) {
		return &Error{Kind: KindPolicy, Field: "COMMITTED_TCB above CURRENT_TCB", Expected: "at most " + current.String(), Actual: committed.String(),
			Hint: "the firmware runs below the level it committed to: no genuine secure processor reports this"}
	}
	if !current.AtLeast(reported) {
		return &Error{Kind: KindPolicy, Field: "REPORTED_TCB above CURRENT_TCB", Expected: "at most " + current.String(), Actual: reported.String(),
			Hint: "the host reports a TCB the firmware does not run"}
	}
	if !p.AllowProvisionalFirmware {
		if err := checkCommitted(r, committed, current, reported); err != nil {
			return err
		}
	} else if err := checkFirmwareNotRolledBack(r); err != nil {
		return err
	}
	min, from, err := v.minTCB(p, r, line)
	if err != nil {
		return err
	}
	if !reported.AtLeast(min) {
		return &Error{Kind: KindPolicy, Field: "TCB below minimum", Expected: "at least " + min.String(), Actual: reported.String(),
			Hint: fmt.Sprintf("%s; the minimum is %s: the node's SEV firmware or microcode needs an update", reported.Below(min), from)}
	}
	// The TCB the guest was launched under: firmware updated since (a
	// live SEV firmware update, late-loaded microcode) raises the
	// reported TCB, but what ran the launch stays what it was.
	if launch := snpext.DecomposeTCB(r.GetLaunchTcb(), line); !launch.AtLeast(min) {
		return &Error{Kind: KindPolicy, Field: "LAUNCH_TCB below minimum", Expected: "at least " + min.String(), Actual: launch.String(),
			Hint: fmt.Sprintf("%s; the minimum is %s: the pod was launched under SEV firmware or microcode below it, and an update since does not undo what ran under it: relaunch the pod", launch.Below(min), from)}
	}
	return nil
}

// provisionalHint names the policy field that accepts provisional
// firmware.
const provisionalHint = "the host runs SEV firmware it has not committed to (it may still roll back to the committed level, whose flaws the running firmware fixes); " +
	"a policy accepts this with allow_provisional_firmware (verify-report --allow-provisional-firmware)"

// checkCommitted refuses provisional firmware: committed or reported
// below current, or a committed firmware version other than the current.
func checkCommitted(r *spb.Report, committed, current, reported snpext.TCB) error {
	if !committed.Equal(current) {
		return &Error{Kind: KindPolicy, Field: "provisional firmware (COMMITTED_TCB below CURRENT_TCB)", Expected: "COMMITTED_TCB = CURRENT_TCB " + current.String(),
			Actual: "COMMITTED_TCB " + committed.String(), Hint: provisionalHint}
	}
	if !reported.Equal(current) {
		return &Error{Kind: KindPolicy, Field: "provisional firmware (REPORTED_TCB below CURRENT_TCB)", Expected: "REPORTED_TCB = CURRENT_TCB " + current.String(),
			Actual: "REPORTED_TCB " + reported.String(), Hint: provisionalHint}
	}
	cur := fmt.Sprintf("%d.%d.%d", r.GetCurrentMajor(), r.GetCurrentMinor(), r.GetCurrentBuild())
	com := fmt.Sprintf("%d.%d.%d", r.GetCommittedMajor(), r.GetCommittedMinor(), r.GetCommittedBuild())
	if cur != com {
		return &Error{Kind: KindPolicy, Field: "provisional firmware (committed version below current)", Expected: "committed firmware " + cur,
			Actual: "committed firmware " + com, Hint: provisionalHint}
	}
	return nil
}

// checkFirmwareNotRolledBack refuses a committed firmware version above
// the current one, which no genuine secure processor reports.
func checkFirmwareNotRolledBack(r *spb.Report) error {
	cur := [3]uint32{r.GetCurrentMajor(), r.GetCurrentMinor(), r.GetCurrentBuild()}
	com := [3]uint32{r.GetCommittedMajor(), r.GetCommittedMinor(), r.GetCommittedBuild()}
	for i := range cur {
		if com[i] != cur[i] {
			if com[i] > cur[i] {
				return &Error{Kind: KindPolicy, Field: "committed firmware version above current", Expected: fmt.Sprintf("at most %d.%d.%d", cur[0], cur[1], cur[2]),
					Actual: fmt.Sprintf("%d.%d.%d", com[0], com[1], com[2]), Hint: "no genuine secure processor reports this"}
			}
			return nil
		}
	}
	return nil
}
