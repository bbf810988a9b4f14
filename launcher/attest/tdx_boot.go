package attest

import (
	"crypto/sha512"
	"errors"
	"fmt"
	"slices"

	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/measurements/tdx"
)

// TDXBoot is the measured boot of a TD's direct kernel boot, as its CC
// event log records it (measurements/tdx DirectBoot): OVMF measures the
// kernel into RTMR1 as an EFI application, the kernel's EFI stub measures
// its load options (the command line) and the initrd into RTMR2.
//
// RTMR0 is replayed from the log but not judged: it measures the TD HOB
// (memory size and layout) and QEMU's ACPI tables, which depend on the VM's
// shape and QEMU version rather than on the image. RTMR3 is not in the
// firmware's log at all; pin it with Policy.RTMRs.
type TDXBoot struct {
	// Kernel is the kernel's Authenticode SHA-384 (48 bytes).
	Kernel Hex `json:"kernel"`
	// LoadOptions is the SHA-384 of the kernel's load options: the command
	// line, followed by " initrd=initrd" with an initrd, UTF-16LE with a
	// terminating NUL (measurements/tdx DirectBoot.LoadOptions).
	LoadOptions Hex `json:"load_options"`
	// Initrd is the SHA-384 of the initrd; empty means the TD boots none
	// and its log must measure none.
	Initrd Hex `json:"initrd,omitempty"`
	// Cmdline is the command line LoadOptions is the digest of, for
	// messages only.
	Cmdline string `json:"cmdline,omitempty"`
}

// tdxTEETCBSVNSize is the size of TEE_TCB_SVN.
const tdxTEETCBSVNSize = 16

func (b *TDXBoot) check() error {
	if b == nil {
		return nil
	}
	if len(b.Kernel) == 0 || len(b.LoadOptions) == 0 {
		return configErr("tdx_boot needs the kernel and load_options digests: a TD whose command line is not measured can run any dm-verity root")
	}
	return errors.Join(checkSize("tdx_boot.kernel", b.Kernel, tdxDigestSize), checkSize("tdx_boot.load_options", b.LoadOptions, tdxDigestSize),
		checkSize("tdx_boot.initrd", b.Initrd, tdxDigestSize))
}

// tcbStatuses are Intel's TCB statuses a policy may accept by name.
var tcbStatuses = []string{"SWHardeningNeeded", "ConfigurationNeeded", "ConfigurationAndSWHardeningNeeded", "OutOfDate", "OutOfDateConfigurationNeeded"}

func checkTCBStatuses(allowed []string) error {
	for _, s := range allowed {
		if s == TCBRevoked {
			return configErr("allow_tcb_status: %s is never accepted", TCBRevoked)
		}
		if !slices.Contains(tcbStatuses, s) {
			return configErr("allow_tcb_status: %q is not one of Intel's statuses (%v)", s, tcbStatuses)
		}
	}
	return nil
}

// BootFromDigests turns measurements/tdx boot digests into a TDXBoot.
func BootFromDigests(d tdx.BootDigests, cmdline string) *TDXBoot {
	return &TDXBoot{Kernel: d.Kernel, LoadOptions: d.LoadOptions, Initrd: d.Initrd, Cmdline: cmdline}
}

// checkMeasuredBoot verifies a CC event log against the RTMRs the TEE
// attested (rtmrs, RTMR0-3) and, when boot is set, its RTMR1 and RTMR2
// events against boot. The log must replay to RTMR0-2 exactly, and to
// RTMR3 when it has RTMR3 events: nothing may be measured that the log
// does not show.
func checkMeasuredBoot(rtmrs [][]byte, eventLog []byte, boot *TDXBoot) error {
	if len(eventLog) == 0 {
		if boot == nil {
			return nil
		}
		return &Error{Kind: KindPolicy, Field: "CC event log", Expected: "the TD's CCEL event log", Actual: "none",
			Hint: "the policy checks the measured kernel, command line and initrd, which only the event log names: the guest sent no log (no /sys/firmware/acpi/tables/data/CCEL?) or the host dropped it"}
	}
	log, err := tdx.ParseEventLog(eventLog)
	if err != nil {
		return failure(KindFormat, "CC event log", err, "")
	}
	if len(rtmrs) != 4 {
		return failure(KindFormat, "RTMRs", fmt.Errorf("%d RTMRs, want 4", len(rtmrs)), "")
	}
	replayed := log.Replay()
	for i := range 4 {
		if i == 3 && !log.HasEvents(3) {
			continue
		}
		if string(replayed[i][:]) != string(rtmrs[i]) {
			return mismatch(fmt.Sprintf("RTMR%d (event log replay)", i), Hex(rtmrs[i]).String(), Hex(replayed[i][:]).String(),
				"the event log is not the one this TD measured: an event was altered, added or removed")
		}
	}
	if boot == nil {
		return nil
	}
	if err := checkRTMR1(log, boot); err != nil {
		return err
	}
	return checkRTMR2(log, boot)
}

func sum384(b []byte) []byte {
	d := sha512.Sum384(b)
	return d[:]
}

func eventField(e tdx.LogEvent, what string) string {
	return fmt.Sprintf("RTMR%d event %d (%s, %s)", e.RTMR(), e.Seq, e.TypeName(), what)
}

func unexpected(e tdx.LogEvent, why string) *Error {
	return &Error{Kind: KindPolicy, Field: eventField(e, "unexpected"), Actual: Hex(e.Digest).String(), Hint: why}
}

// checkRTMR1: one EFI application, the kernel, and otherwise only OVMF's
// fixed boot-attempt actions and separators, each the digest of its data.
func checkRTMR1(log *tdx.EventLog, boot *TDXBoot) error {
	var kernels int
	for _, e := range log.Events {
		if e.Type == tdx.EvNoAction || e.RTMR() != 1 {
			continue
		}
		switch e.Type {
		case tdx.EvEFIBootServicesApplication:
			kernels++
			if kernels > 1 {
				return unexpected(e, "a second EFI application ran before the kernel took over (a boot loader or shell the manifest does not name)")
			}
			if string(e.Digest) != string(boot.Kernel) {
				return mismatch(eventField(e, "the kernel"), boot.Kernel.String(), Hex(e.Digest).String(),
					"the TD booted another kernel than the manifest's (Authenticode SHA-384)")
			}
		case tdx.EvEFIAction:
			if !slices.Contains(tdx.BootActions, string(e.Data)) || string(e.Digest) != string(sum384(e.Data)) {
				return unexpected(e, fmt.Sprintf("an EFI action %q other than OVMF's boot-attempt and ExitBootServices actions, or whose digest is not that of its text", e.Data))
			}
		case tdx.EvSeparator:
			if string(e.Data) != "\x00\x00\x00\x00" || string(e.Digest) != string(sum384(e.Data)) {
				return unexpected(e, "a separator whose data or digest is not four zero bytes")
			}
		default:
			return unexpected(e, "OVMF's direct boot measures nothing else into RTMR1")
		}
	}
	if kernels == 0 {
		return &Error{Kind: KindPolicy, Field: "RTMR1 kernel event (EV_EFI_BOOT_SERVICES_APPLICATION)", Expected: boot.Kernel.String(), Actual: "none",
			Hint: "the log records no EFI application: the TD did not boot a kernel through OVMF's loader"}
	}
	return nil
}

// checkRTMR2: exactly the EFI stub's load options event and, with an
// initrd, its initrd event.
func checkRTMR2(log *tdx.EventLog, boot *TDXBoot) error {
	var options, initrds int
	cmdline := ""
	if boot.Cmdline != "" {
		cmdline = fmt.Sprintf(" %q", boot.Cmdline)
	}
	for _, e := range log.Events {
		if e.Type == tdx.EvNoAction || e.RTMR() != 2 {
			continue
		}
		id, _, ok := e.Tag()
		switch {
		case ok && id == tdx.TagLinuxLoadOptions:
			options++
			if options > 1 {
				return unexpected(e, "a second LOADED_IMAGE::LoadOptions measurement: a second kernel or loader ran")
			}
			if string(e.Digest) != string(boot.LoadOptions) {
				return mismatch(eventField(e, "LOADED_IMAGE::LoadOptions, the kernel command line"), boot.LoadOptions.String(), Hex(e.Digest).String(),
					"the TD booted with another command line than the manifest's"+cmdline+" (another dm-verity root hash, say)")
			}
		case ok && id == tdx.TagLinuxInitrd:
			initrds++
			if len(boot.Initrd) == 0 {
				return unexpected(e, "the TD loaded an initrd the manifest does not name")
			}
			if initrds > 1 {
				return unexpected(e, "a second initrd")
			}
			if string(e.Digest) != string(boot.Initrd) {
				return mismatch(eventField(e, "Linux initrd"), boot.Initrd.String(), Hex(e.Digest).String(),
					"the TD booted another initrd than the manifest's")
			}
		default:
			return unexpected(e, "the kernel's EFI stub measures only its command line and initrd into RTMR2")
		}
	}
	if options == 0 {
		return &Error{Kind: KindPolicy, Field: "RTMR2 command line event (EV_EVENT_TAG LOADED_IMAGE::LoadOptions)", Expected: boot.LoadOptions.String(), Actual: "none",
			Hint: "the kernel did not measure its command line: its EFI stub predates EFI_CC_MEASUREMENT_PROTOCOL support (Linux 6.9), so the command line, dm-verity root hash included, is unattested"}
	}
	if len(boot.Initrd) > 0 && initrds == 0 {
		return &Error{Kind: KindPolicy, Field: "RTMR2 initrd event (EV_EVENT_TAG Linux initrd)", Expected: boot.Initrd.String(), Actual: "none",
			Hint: "the kernel measured no initrd: it booted without the manifest's initrd, or its EFI stub predates Linux 6.9"}
	}
	return nil
}

// BootFromManifest returns the TDXBoot an image manifest's boot digests
// name (nil for none); cmdline is the command line they are over, for
// messages.
func BootFromManifest(d *manifest.BootDigests, cmdline string) (*TDXBoot, error) {
	if d == nil {
		return nil, nil
	}
	b := &TDXBoot{Cmdline: cmdline}
	var err error
	if b.Kernel, err = ParseHex(d.Kernel); err != nil {
		return nil, fmt.Errorf("manifest boot.kernel: %w", err)
	}
	if b.LoadOptions, err = ParseHex(d.LoadOptions); err != nil {
		return nil, fmt.Errorf("manifest boot.load_options: %w", err)
	}
	if b.Initrd, err = ParseHex(d.Initrd); err != nil {
		return nil, fmt.Errorf("manifest boot.initrd: %w", err)
	}
	return b, b.check()
}

// TDXPolicyFromManifest returns what a TD booted from an image manifest's
// TDX digests must show: the MRTD, the event log's kernel, command line
// and initrd, the predicted RTMR1 and RTMR2, and an RTMR3 nothing
// extended (c8s's guest never does). RTMR0 is not pinned: it depends on the
// VM's memory layout and QEMU's ACPI tables (measurements/tdx).
func TDXPolicyFromManifest(d *manifest.TDXDigests) (*Policy, error) {
	p := &Policy{}
	var err error
	if p.MRTD, err = ParseHex(d.MRTD); err != nil {
		return nil, fmt.Errorf("manifest MRTD: %w", err)
	}
	if d.Boot == nil || d.RTMR1 == "" || d.RTMR2 == "" {
		return nil, errors.New("the image manifest predicts no TDX measured boot (digests.tdx.boot, rtmr1, rtmr2): rebuild the image with a current mkmanifest; a TD's kernel, command line and initrd cannot be checked without them")
	}
	if p.TDXBoot, err = BootFromManifest(d.Boot, d.Cmdline); err != nil {
		return nil, err
	}
	r1, err := ParseHex(d.RTMR1)
	if err != nil {
		return nil, fmt.Errorf("manifest RTMR1: %w", err)
	}
	r2, err := ParseHex(d.RTMR2)
	if err != nil {
		return nil, fmt.Errorf("manifest RTMR2: %w", err)
	}
	p.RTMRs = []Hex{nil, r1, r2, make(Hex, tdxDigestSize)}
	return p, nil
}
