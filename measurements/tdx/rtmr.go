package tdx

import (
	"crypto/sha512"
	"encoding/binary"
	"fmt"
	"unicode/utf16"

	"github.com/c8s-dev/c8s/measurements/uki"
)

// Event is one measurement extended into an RTMR: the SHA-384 digest the
// firmware or the kernel's EFI stub computed, and what it covers.
type Event struct {
	Description string
	Digest      []byte
}

// Register is a predicted RTMR with the event log that produces it.
type Register struct {
	Value  [48]byte
	Events []Event
}

// Replay extends the events, in order, into an all-zero RTMR:
// RTMR = SHA-384(RTMR || digest).
func Replay(events []Event) [48]byte {
	var r [48]byte
	for _, e := range events {
		h := sha512.New384()
		h.Write(r[:])
		h.Write(e.Digest)
		copy(r[:], h.Sum(nil))
	}
	return r
}

func digest(b []byte) []byte {
	d := sha512.Sum384(b)
	return d[:]
}

// DirectBoot describes a QEMU direct boot (-kernel, -append, -initrd).
//
// The RTMR1 and RTMR2 predictions rest on these assumptions, which match
// the published conventions of virtee/tdx-measure for OVMF/TDVF releases
// from edk2-stable202505 on with QEMU 10 and later. They were not checked
// against a TD here: the build machine has neither TDX hardware nor a QEMU
// with TDX support. Compare with the guest's CCEL event log before relying
// on them.
//
//   - OVMF loads Kernel, unmodified, through its QEMU kernel loader and
//     measures it as an EFI application (PCR 4, RTMR1) with its SHA-384
//     Authenticode digest. Older QEMU/OVMF pairs expose a kernel whose setup
//     header QEMU has patched, and the digest differs.
//   - The rest of RTMR1 is the fixed sequence of a first boot attempt with
//     no boot loader: the EV_EFI_ACTION "Calling EFI Application from Boot
//     Option", the separator (four zero bytes), then "Exit Boot Services
//     Invocation" and "Exit Boot Services Returned with Success".
//   - OVMF gives the kernel the load options Cmdline, followed by
//     " initrd=initrd" when an initrd is passed, as UTF-16LE with a
//     terminating NUL; with neither a command line nor an initrd there are
//     no load options.
//   - The kernel's EFI stub measures into PCR 9, which TDX maps to RTMR2,
//     through EFI_CC_MEASUREMENT_PROTOCOL: first the load options, then the
//     initrd's bytes. That needs a kernel whose EFI stub uses the CC
//     measurement protocol (upstream Linux 6.9 and later); with an older
//     kernel (Debian 12's 6.1, for instance) RTMR2 holds neither event.
//   - An empty Initrd means no initrd, as QEMU does not expose an empty
//     initrd to OVMF.
type DirectBoot struct {
	Kernel  []byte
	Cmdline string
	Initrd  []byte
}

// Fixed EV_EFI_ACTION strings OVMF measures on a direct boot.
const (
	actionCallingApp  = "Calling EFI Application from Boot Option"
	actionExitBS      = "Exit Boot Services Invocation"
	actionExitBSSucc  = "Exit Boot Services Returned with Success"
	initrdLoadOptions = " initrd=initrd"
)

// RTMR1 predicts RTMR1 for the direct boot; see DirectBoot.
func (b DirectBoot) RTMR1() (Register, error) {
	kd, err := uki.AuthenticodeSHA384(b.Kernel)
	if err != nil {
		return Register{}, fmt.Errorf("tdx: kernel: %w", err)
	}
	sep := make([]byte, 4)
	events := []Event{
		{"kernel image (Authenticode SHA-384)", kd},
		{"EV_EFI_ACTION " + actionCallingApp, digest([]byte(actionCallingApp))},
		{"EV_SEPARATOR", digest(sep)},
		{"EV_EFI_ACTION " + actionExitBS, digest([]byte(actionExitBS))},
		{"EV_EFI_ACTION " + actionExitBSSucc, digest([]byte(actionExitBSSucc))},
	}
	return Register{Value: Replay(events), Events: events}, nil
}

// BootDigests are the measured-boot digests of a direct boot that a
// verifier looks for in a TD's event log.
type BootDigests struct {
	// Kernel is the kernel's Authenticode SHA-384, the digest of the
	// EV_EFI_BOOT_SERVICES_APPLICATION event in RTMR1.
	Kernel []byte
	// LoadOptions is the SHA-384 of the load options (LoadOptions), the
	// digest of the LOADED_IMAGE::LoadOptions tagged event in RTMR2; nil
	// when OVMF hands the kernel none.
	LoadOptions []byte
	// Initrd is the SHA-384 of the initrd, the digest of the Linux
	// initrd tagged event in RTMR2; nil without an initrd.
	Initrd []byte
}

// Digests returns the boot's measured-boot digests.
func (b DirectBoot) Digests() (BootDigests, error) {
	kd, err := uki.AuthenticodeSHA384(b.Kernel)
	if err != nil {
		return BootDigests{}, fmt.Errorf("tdx: kernel: %w", err)
	}
	d := BootDigests{Kernel: kd}
	if lo := b.LoadOptions(); lo != nil {
		d.LoadOptions = digest(lo)
	}
	if len(b.Initrd) > 0 {
		d.Initrd = digest(b.Initrd)
	}
	return d, nil
}

// kernelDevicePath is the device path OVMF's QEMU kernel loader gives the
// kernel: VenMedia(1428F772-B64A-441E-B8C3-9EBDD7F893C7)/File(kernel), then
// the end node (as a genuine TD's log records it).
var kernelDevicePath = []byte{
	0x04, 0x03, 0x14, 0x00, 0x72, 0xf7, 0x28, 0x14, 0x4a, 0xb6, 0x1e, 0x44, 0xb8, 0xc3, 0x9e, 0xbd, 0xd7, 0xf8, 0x93, 0xc7,
	0x04, 0x04, 0x12, 0x00, 'k', 0, 'e', 0, 'r', 0, 'n', 0, 'e', 0, 'l', 0, 0, 0,
	0x7f, 0xff, 0x04, 0x00,
}

// LogEvents returns the RTMR1 and RTMR2 records of the direct boot in the
// order a TD's CC event log holds them (see DirectBoot for the
// assumptions): the kernel image, the boot attempt and separator, the
// EFI stub's load options and initrd, then ExitBootServices.
func (b DirectBoot) LogEvents() ([]LogEvent, error) {
	d, err := b.Digests()
	if err != nil {
		return nil, err
	}
	image := binary.LittleEndian.AppendUint64(nil, 0)
	image = binary.LittleEndian.AppendUint64(image, uint64(len(b.Kernel)))
	image = binary.LittleEndian.AppendUint64(image, 0)
	image = binary.LittleEndian.AppendUint64(image, uint64(len(kernelDevicePath)))
	image = append(image, kernelDevicePath...)
	action := func(s string) LogEvent {
		return LogEvent{MRIndex: MRIndexRTMR1, Type: EvEFIAction, Digest: digest([]byte(s)), Data: []byte(s)}
	}
	sep := make([]byte, 4)
	events := []LogEvent{
		{MRIndex: MRIndexRTMR1, Type: EvEFIBootServicesApplication, Digest: d.Kernel, Data: image},
		action(actionCallingApp),
		{MRIndex: MRIndexRTMR1, Type: EvSeparator, Digest: digest(sep), Data: sep},
	}
	if d.LoadOptions != nil {
		events = append(events, LogEvent{MRIndex: MRIndexRTMR2, Type: EvEventTag, Digest: d.LoadOptions,
			Data: taggedEvent(linuxEFILoadOptionsTag, linuxEFILoadOptionsTagDescription)})
	}
	if d.Initrd != nil {
		events = append(events, LogEvent{MRIndex: MRIndexRTMR2, Type: EvEventTag, Digest: d.Initrd,
			Data: taggedEvent(linuxEFIInitrdTag, linuxEFIInitrdTagDescription)})
	}
	events = append(events, action(actionExitBS), action(actionExitBSSucc))
	return events, nil
}

// LoadOptions returns the UTF-16LE load options, NUL included, OVMF hands
// the kernel, or nil when it hands none.
func (b DirectBoot) LoadOptions() []byte {
	s := b.Cmdline
	if len(b.Initrd) > 0 {
		s += initrdLoadOptions
	}
	if s == "" {
		return nil
	}
	u := utf16.Encode([]rune(s))
	out := make([]byte, 0, 2*len(u)+2)
	for _, c := range u {
		out = binary.LittleEndian.AppendUint16(out, c)
	}
	return append(out, 0, 0)
}

// RTMR2 predicts RTMR2 for the direct boot; see DirectBoot.
func (b DirectBoot) RTMR2() Register {
	var events []Event
	if lo := b.LoadOptions(); lo != nil {
		events = append(events, Event{fmt.Sprintf("LOADED_IMAGE::LoadOptions %q (UTF-16LE, NUL-terminated)", string(utf16Decode(lo))), digest(lo)})
	}
	if len(b.Initrd) > 0 {
		events = append(events, Event{fmt.Sprintf("Linux initrd (%d bytes)", len(b.Initrd)), digest(b.Initrd)})
	}
	return Register{Value: Replay(events), Events: events}
}

// utf16Decode turns NUL-terminated UTF-16LE back into runes for display.
func utf16Decode(b []byte) []rune {
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		if c := binary.LittleEndian.Uint16(b[i:]); c != 0 {
			u = append(u, c)
		}
	}
	return utf16.Decode(u)
}
