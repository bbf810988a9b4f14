package tdx

import (
	"bytes"
	"crypto/sha512"
	"encoding/binary"
	"errors"
	"fmt"
)

// The CC event log (the CCEL ACPI table's log area, which a Linux TD
// guest exposes as /sys/firmware/acpi/tables/data/CCEL) is a TCG2
// "crypto agile" event log (TCG PC Client Platform Firmware Profile,
// section 10): a first TCG_PCR_EVENT in the SHA-1 format holding the
// TCG_EfiSpecIDEvent, then TCG_PCR_EVENT2 records with a digest list. In
// a CC log the record's PCRIndex field is the CC measurement register
// index of UEFI 2.10 section 38.4.1: 0 is MRTD, 1-4 are RTMR0-3. The
// firmware fills the unused rest of the area with 0xFF.

// TCG event types this package names (TCG PC Client PFP, table 9).
const (
	EvPostCode                   uint32 = 0x00000001
	EvNoAction                   uint32 = 0x00000003
	EvSeparator                  uint32 = 0x00000004
	EvEventTag                   uint32 = 0x00000006
	EvPlatformConfigFlags        uint32 = 0x0000000A
	EvEFIVariableDriverConfig    uint32 = 0x80000001
	EvEFIVariableBoot            uint32 = 0x80000002
	EvEFIBootServicesApplication uint32 = 0x80000003
	EvEFIAction                  uint32 = 0x80000007
	EvEFIPlatformFirmwareBlob2   uint32 = 0x8000000A
	EvEFIHandoffTables2          uint32 = 0x8000000B
	EvEFIVariableAuthority       uint32 = 0x800000E0
)

const (
	tpmAlgSHA384                         uint16 = 0x000C
	specIDSignature                             = "Spec ID Event03\x00"
	maxLogEvents                                = 1 << 16
	maxDigests                                  = 8
	sha384Size                                  = 48
	sha1Size                                    = 20
	specIDFixedSize                             = 16 + 4 + 4 + 4 // signature, platform class, versions and uintn size, algorithm count
	linuxEFIInitrdTag                           = 0x8F3B22EC
	linuxEFILoadOptionsTag                      = 0x8F3B22ED
	linuxEFIInitrdTagDescription                = "Linux initrd\x00"
	linuxEFILoadOptionsTagDescription           = "LOADED_IMAGE::LoadOptions\x00"
	efiCallingEFIApplicationAction              = actionCallingApp
	efiReturningFromEFIApplicationAction        = "Returning from EFI Application from Boot Option"
)

// CC measurement register indexes of the event log's records.
const (
	MRIndexMRTD  = 0
	MRIndexRTMR0 = 1
	MRIndexRTMR1 = 2
	MRIndexRTMR2 = 3
	MRIndexRTMR3 = 4
)

// LogEvent is one record of a CC event log.
type LogEvent struct {
	// Seq is the record's position in the log (the spec ID event is 0).
	Seq int
	// MRIndex is the CC measurement register index (1-4 for RTMR0-3).
	MRIndex uint32
	// Type is the TCG event type.
	Type uint32
	// Digest is the record's SHA-384 digest (nil for a record without
	// one, which a TDX log never has).
	Digest []byte
	// Data is the event data.
	Data []byte
}

// RTMR returns the RTMR the event extends (0-3), or -1 for MRTD or an
// index out of range.
func (e LogEvent) RTMR() int {
	if e.MRIndex < MRIndexRTMR0 || e.MRIndex > MRIndexRTMR3 {
		return -1
	}
	return int(e.MRIndex - 1)
}

// TypeName names the event type.
func (e LogEvent) TypeName() string { return EventTypeName(e.Type) }

// EventTypeName names a TCG event type, or gives it in hex.
func EventTypeName(t uint32) string {
	switch t {
	case EvPostCode:
		return "EV_POST_CODE"
	case EvNoAction:
		return "EV_NO_ACTION"
	case EvSeparator:
		return "EV_SEPARATOR"
	case EvEventTag:
		return "EV_EVENT_TAG"
	case EvPlatformConfigFlags:
		return "EV_PLATFORM_CONFIG_FLAGS"
	case EvEFIVariableDriverConfig:
		return "EV_EFI_VARIABLE_DRIVER_CONFIG"
	case EvEFIVariableBoot:
		return "EV_EFI_VARIABLE_BOOT"
	case EvEFIBootServicesApplication:
		return "EV_EFI_BOOT_SERVICES_APPLICATION"
	case EvEFIAction:
		return "EV_EFI_ACTION"
	case EvEFIPlatformFirmwareBlob2:
		return "EV_EFI_PLATFORM_FIRMWARE_BLOB2"
	case EvEFIHandoffTables2:
		return "EV_EFI_HANDOFF_TABLES2"
	case EvEFIVariableAuthority:
		return "EV_EFI_VARIABLE_AUTHORITY"
	}
	return fmt.Sprintf("event type %#x", t)
}

// Tag returns the tagged event id of an EV_EVENT_TAG event
// (TCG_PCClientTaggedEvent: taggedEventID, taggedEventDataSize, data).
func (e LogEvent) Tag() (id uint32, data []byte, ok bool) {
	if e.Type != EvEventTag || len(e.Data) < 8 {
		return 0, nil, false
	}
	n := binary.LittleEndian.Uint32(e.Data[4:])
	if uint64(n) > uint64(len(e.Data)-8) {
		return 0, nil, false
	}
	return binary.LittleEndian.Uint32(e.Data), e.Data[8 : 8+n], true
}

// EventLog is a parsed CC event log.
type EventLog struct {
	// Events are the records after the spec ID event, EV_NO_ACTION ones
	// included.
	Events []LogEvent
}

// ParseEventLog parses a CC event log. Trailing bytes after the last
// record must be the firmware's 0xFF fill (or zeros); anything else is an
// error, so that nothing can hide behind a record the parser stopped at.
func ParseEventLog(b []byte) (*EventLog, error) {
	r := reader{b: b}
	// TCG_PCR_EVENT: PCRIndex, EventType, SHA-1 digest, EventSize, Event.
	if _, err := r.u32("spec ID event index"); err != nil {
		return nil, err
	}
	typ, err := r.u32("spec ID event type")
	if err != nil {
		return nil, err
	}
	if typ != EvNoAction {
		return nil, fmt.Errorf("tdx: event log: the first event is %s, not the EV_NO_ACTION spec ID event", EventTypeName(typ))
	}
	if _, err := r.bytes(sha1Size, "spec ID event digest"); err != nil {
		return nil, err
	}
	spec, err := r.sized("spec ID event")
	if err != nil {
		return nil, err
	}
	sizes, err := parseSpecID(spec)
	if err != nil {
		return nil, err
	}
	log := &EventLog{}
	for seq := 1; r.off < len(b); seq++ {
		if r.restIsFill() {
			break
		}
		if seq > maxLogEvents {
			return nil, fmt.Errorf("tdx: event log: more than %d events", maxLogEvents)
		}
		e, err := r.event2(seq, sizes)
		if err != nil {
			return nil, err
		}
		log.Events = append(log.Events, e)
	}
	return log, nil
}

// parseSpecID reads TCG_EfiSpecIDEvent and returns the digest size of each
// algorithm; the log must carry SHA-384.
func parseSpecID(spec []byte) (map[uint16]int, error) {
	if len(spec) < specIDFixedSize || string(spec[:16]) != specIDSignature {
		return nil, errors.New("tdx: event log: the first event is not a TCG_EfiSpecIDEvent (\"Spec ID Event03\"): not a crypto-agile TCG2 log")
	}
	n := binary.LittleEndian.Uint32(spec[24:])
	if n == 0 || n > maxDigests || uint64(len(spec)) < uint64(specIDFixedSize)+4*uint64(n) {
		return nil, fmt.Errorf("tdx: event log: the spec ID event lists %d algorithms in %d bytes", n, len(spec))
	}
	sizes := map[uint16]int{}
	for i := range int(n) {
		p := spec[specIDFixedSize+4*i:]
		alg, size := binary.LittleEndian.Uint16(p), int(binary.LittleEndian.Uint16(p[2:]))
		if size == 0 || size > 64 {
			return nil, fmt.Errorf("tdx: event log: algorithm %#x has digest size %d", alg, size)
		}
		sizes[alg] = size
	}
	if sizes[tpmAlgSHA384] != sha384Size {
		return nil, errors.New("tdx: event log: the spec ID event declares no SHA-384 digests, which TDX RTMRs use")
	}
	return sizes, nil
}

type reader struct {
	b   []byte
	off int
}

func (r *reader) bytes(n int, what string) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, fmt.Errorf("tdx: event log: %s at offset %d: %d bytes needed, %d left", what, r.off, n, len(r.b)-r.off)
	}
	out := r.b[r.off : r.off+n]
	r.off += n
	return out, nil
}

func (r *reader) u32(what string) (uint32, error) {
	b, err := r.bytes(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *reader) sized(what string) ([]byte, error) {
	n, err := r.u32(what + " size")
	if err != nil {
		return nil, err
	}
	if uint64(n) > uint64(len(r.b)-r.off) {
		return nil, fmt.Errorf("tdx: event log: %s at offset %d claims %d bytes, %d left", what, r.off, n, len(r.b)-r.off)
	}
	return r.bytes(int(n), what)
}

// restIsFill reports whether what is left is the log area's fill: all
// 0xFF (edk2 initializes the area so) or all zero.
func (r *reader) restIsFill() bool {
	rest := r.b[r.off:]
	return len(bytes.Trim(rest, "\xff")) == 0 || len(bytes.Trim(rest, "\x00")) == 0
}

// event2 reads a TCG_PCR_EVENT2.
func (r *reader) event2(seq int, sizes map[uint16]int) (LogEvent, error) {
	e := LogEvent{Seq: seq}
	var err error
	if e.MRIndex, err = r.u32(fmt.Sprintf("event %d index", seq)); err != nil {
		return e, err
	}
	if e.Type, err = r.u32(fmt.Sprintf("event %d type", seq)); err != nil {
		return e, err
	}
	count, err := r.u32(fmt.Sprintf("event %d digest count", seq))
	if err != nil {
		return e, err
	}
	if count > maxDigests {
		return e, fmt.Errorf("tdx: event log: event %d has %d digests", seq, count)
	}
	for range count {
		ab, err := r.bytes(2, fmt.Sprintf("event %d digest algorithm", seq))
		if err != nil {
			return e, err
		}
		alg := binary.LittleEndian.Uint16(ab)
		size, ok := sizes[alg]
		if !ok {
			return e, fmt.Errorf("tdx: event log: event %d has a digest of algorithm %#x, which the spec ID event does not declare", seq, alg)
		}
		d, err := r.bytes(size, fmt.Sprintf("event %d digest", seq))
		if err != nil {
			return e, err
		}
		if alg == tpmAlgSHA384 {
			if e.Digest != nil {
				return e, fmt.Errorf("tdx: event log: event %d has two SHA-384 digests", seq)
			}
			e.Digest = d
		}
	}
	if e.Data, err = r.sized(fmt.Sprintf("event %d data", seq)); err != nil {
		return e, err
	}
	if e.Type != EvNoAction {
		if e.RTMR() < 0 {
			return e, fmt.Errorf("tdx: event log: event %d (%s) extends measurement register index %d; a TD's firmware and kernel extend RTMR0-3 only (index 1-4)", seq, e.TypeName(), e.MRIndex)
		}
		if e.Digest == nil {
			return e, fmt.Errorf("tdx: event log: event %d (%s) has no SHA-384 digest", seq, e.TypeName())
		}
	}
	return e, nil
}

// Replay extends every measured event's SHA-384 digest into its RTMR, in
// log order, from all-zero registers, as the TDX module did.
func (l *EventLog) Replay() [4][48]byte {
	var out [4][48]byte
	for _, e := range l.Events {
		if e.Type == EvNoAction {
			continue
		}
		i := e.RTMR()
		h := sha512.New384()
		h.Write(out[i][:])
		h.Write(e.Digest)
		copy(out[i][:], h.Sum(nil))
	}
	return out
}

// HasEvents reports whether the log extends RTMR i.
func (l *EventLog) HasEvents(rtmr int) bool {
	for _, e := range l.Events {
		if e.Type != EvNoAction && e.RTMR() == rtmr {
			return true
		}
	}
	return false
}

// MarshalEventLog lays events out as a CC event log with SHA-384 digests
// (spec ID event first), as TdTcg2Dxe does. Seq is ignored.
func MarshalEventLog(events []LogEvent) ([]byte, error) {
	var b []byte
	le := binary.LittleEndian
	spec := []byte(specIDSignature)
	spec = le.AppendUint32(spec, 0) // platform class: client
	spec = append(spec, 0, 2, 0, 2) // spec version 2.0, errata 0, uintnSize 2 (64-bit)
	spec = le.AppendUint32(spec, 1)
	spec = le.AppendUint16(spec, tpmAlgSHA384)
	spec = le.AppendUint16(spec, sha384Size)
	spec = append(spec, 0) // vendorInfoSize
	b = le.AppendUint32(b, MRIndexRTMR0)
	b = le.AppendUint32(b, EvNoAction)
	b = append(b, make([]byte, sha1Size)...)
	b = le.AppendUint32(b, uint32(len(spec)))
	b = append(b, spec...)
	for i, e := range events {
		if len(e.Digest) != sha384Size {
			return nil, fmt.Errorf("tdx: event %d: digest is %d bytes, want %d", i+1, len(e.Digest), sha384Size)
		}
		b = le.AppendUint32(b, e.MRIndex)
		b = le.AppendUint32(b, e.Type)
		b = le.AppendUint32(b, 1)
		b = le.AppendUint16(b, tpmAlgSHA384)
		b = append(b, e.Digest...)
		b = le.AppendUint32(b, uint32(len(e.Data)))
		b = append(b, e.Data...)
	}
	return b, nil
}

// taggedEvent lays out a TCG_PCClientTaggedEvent.
func taggedEvent(id uint32, desc string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, id)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(desc)))
	return append(b, desc...)
}

// Fixed event data of the boot-attempt and ExitBootServices actions and
// the tags of the Linux EFI stub, for verifiers that classify events.
var (
	// BootActions are the EV_EFI_ACTION strings OVMF measures into RTMR1
	// around booting an EFI application.
	BootActions = []string{efiCallingEFIApplicationAction, efiReturningFromEFIApplicationAction, actionExitBS, actionExitBSSucc}
)

// Tagged event ids of the Linux EFI stub (include/linux/efi.h).
const (
	TagLinuxInitrd      = linuxEFIInitrdTag
	TagLinuxLoadOptions = linuxEFILoadOptionsTag
)
