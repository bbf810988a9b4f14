package attest

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/measurements/tdx"
)

// A genuine TDX quote and the event log of the same TD (dstack's
// sdk/simulator, testdata/tdx/README.md): OVMF direct boot of a kernel
// with a command line and an initrd.
const dstackDir = "testdata/tdx/dstack/"

// dstackTime is within the PCK certificate's validity.
var dstackTime = func() time.Time { return time.Date(2025, time.June, 20, 0, 0, 0, 0, time.UTC) }

// dstackCCEL lays out dstack's recorded firmware and kernel events (RTMR0-2;
// its RTMR3 events are dstack's own runtime log, not CCEL records) as the
// CC event log they came from: TCG2 records with the CC MR index
// (imr + 1), type, SHA-384 digest and event data, as recorded.
func dstackCCEL(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(dstackDir + "eventlog.json")
	if err != nil {
		t.Fatal(err)
	}
	var recs []struct {
		IMR     uint32 `json:"imr"`
		Type    uint32 `json:"event_type"`
		Digest  string `json:"digest"`
		Payload string `json:"event_payload"`
	}
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatal(err)
	}
	var events []tdx.LogEvent
	for _, r := range recs {
		if r.IMR > 2 {
			continue
		}
		d, _ := hex.DecodeString(r.Digest)
		p, _ := hex.DecodeString(r.Payload)
		events = append(events, tdx.LogEvent{MRIndex: r.IMR + 1, Type: r.Type, Digest: d, Data: p})
	}
	raw, err := tdx.MarshalEventLog(events)
	if err != nil {
		t.Fatal(err)
	}
	// OVMF's log area is 64 KiB, filled with 0xFF after the last event.
	return append(raw, bytes.Repeat([]byte{0xff}, 65536-len(raw))...)
}

// dstackBoot is the measured boot "the manifest" of that deployment names:
// the digests of its kernel, command line and initrd events.
func dstackBoot(t testing.TB) *TDXBoot {
	t.Helper()
	must := func(s string) Hex {
		h, err := ParseHex(s)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	return &TDXBoot{
		Kernel:      must("0db5964580e727672734da95797318d8455ab74b3e3d66fbb1aaa4ddd01a3f8555f4889e57c19a15c165594e31678dc0"),
		LoadOptions: must("ad49ca7e80258d7580c5c580cd21ada7ecbf418dde5197d6f8c835493ceb6edec0f8954b733bd9b889f96f33e5f9cb05"),
		Initrd:      must("e0cdb72fbba75a0f4d396c0b80a4336db049b383a9730467160dec0b7059cb22aca87639dcc655d935d6c6356b3108ad"),
	}
}

func dstackQuote(t testing.TB) ([]byte, *Policy) {
	t.Helper()
	quote, err := os.ReadFile(dstackDir + "quote.bin")
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParseTDXQuote(quote)
	if err != nil {
		t.Fatal(err)
	}
	body := q.GetTdQuoteBody()
	return quote, &Policy{MRTD: body.GetMrTd(), Nonce: body.GetReportData()}
}

func tdxVerifierAt(t testing.TB, now func() time.Time, coll *TDXCollateral) *Verifier {
	t.Helper()
	v, err := NewVerifier(Trust{Mode: ModeTDX, Now: now, TDXCollateral: coll})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func kindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}

// A genuine quote with its TD's event log: the log replays to the quote's
// RTMR0-2 and names the boot the policy expects.
func TestTDXEventLogGenuine(t *testing.T) {
	quote, p := dstackQuote(t)
	p.TDXBoot = dstackBoot(t)
	v := tdxVerifierAt(t, dstackTime, nil)
	c, err := v.VerifyTDXEvidence(quote, dstackCCEL(t), p)
	if err != nil {
		t.Fatalf("genuine quote and event log: %v", err)
	}
	if !c.EventLogReplayed || c.TCB != nil {
		t.Errorf("claims %+v", c)
	}
	// c8s's RTMR1/RTMR2 model (measurements/tdx DirectBoot) on this TD's
	// digests gives its RTMRs: the predictions the manifest records have
	// the shape of a genuine TD's.
	r1 := tdx.Replay([]tdx.Event{{Digest: p.TDXBoot.Kernel}, {Digest: sum384([]byte("Calling EFI Application from Boot Option"))},
		{Digest: sum384(make([]byte, 4))}, {Digest: sum384([]byte("Exit Boot Services Invocation"))}, {Digest: sum384([]byte("Exit Boot Services Returned with Success"))}})
	r2 := tdx.Replay([]tdx.Event{{Digest: p.TDXBoot.LoadOptions}, {Digest: p.TDXBoot.Initrd}})
	if !bytes.Equal(r1[:], c.RTMRs[1]) || !bytes.Equal(r2[:], c.RTMRs[2]) {
		t.Errorf("DirectBoot's event model gives RTMR1 %x RTMR2 %x; the genuine TD has %s %s", r1, r2, c.RTMRs[1], c.RTMRs[2])
	}
	// The same values pinned as RTMRs pass too.
	p.RTMRs = []Hex{nil, r1[:], r2[:]}
	if _, err := v.VerifyTDXEvidence(quote, dstackCCEL(t), p); err != nil {
		t.Errorf("pinned RTMR1/RTMR2: %v", err)
	}
}

// A kernel swapped on a TDX-shaped policy is refused, naming the RTMR and
// the event; so are another command line and another initrd.
func TestTDXEventLogRefusesAnotherBoot(t *testing.T) {
	quote, p := dstackQuote(t)
	v := tdxVerifierAt(t, dstackTime, nil)
	ccel := dstackCCEL(t)
	for name, c := range map[string]struct {
		edit  func(*TDXBoot)
		field string
	}{
		"kernel":  {func(b *TDXBoot) { b.Kernel = sum384([]byte("the manifest's kernel")) }, "RTMR1 event 12 (EV_EFI_BOOT_SERVICES_APPLICATION, the kernel)"},
		"cmdline": {func(b *TDXBoot) { b.LoadOptions = sum384([]byte("another command line")) }, "RTMR2 event 17 (EV_EVENT_TAG, LOADED_IMAGE::LoadOptions, the kernel command line)"},
		"initrd":  {func(b *TDXBoot) { b.Initrd = sum384([]byte("another initrd")) }, "RTMR2 event 18 (EV_EVENT_TAG, Linux initrd)"},
	} {
		b := dstackBoot(t)
		c.edit(b)
		p.TDXBoot = b
		_, err := v.VerifyTDXEvidence(quote, ccel, p)
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindMismatch || e.Field != c.field {
			t.Errorf("%s swapped: %v, want a mismatch of %s", name, err, c.field)
			continue
		}
		t.Logf("%s swapped: %v", name, err)
	}
	// A policy without an initrd refuses a TD that loaded one.
	b := dstackBoot(t)
	b.Initrd = nil
	p.TDXBoot = b
	if _, err := v.VerifyTDXEvidence(quote, ccel, p); err == nil || !strings.Contains(err.Error(), "initrd the manifest does not name") {
		t.Errorf("unexpected initrd: %v", err)
	}
}

// A log whose event was altered, or that is not this TD's, does not
// replay to the quote's RTMRs; and a policy that needs the log refuses a
// quote without one.
func TestTDXEventLogTampered(t *testing.T) {
	quote, p := dstackQuote(t)
	p.TDXBoot = dstackBoot(t)
	v := tdxVerifierAt(t, dstackTime, nil)
	ccel := dstackCCEL(t)
	// Make the log name the manifest's kernel instead of the one that ran.
	forged := bytes.Replace(ccel, p.TDXBoot.Kernel, sum384([]byte("a kernel the owner trusts")), 1)
	p2 := *p
	b := *p.TDXBoot
	b.Kernel = sum384([]byte("a kernel the owner trusts"))
	p2.TDXBoot = &b
	_, err := v.VerifyTDXEvidence(quote, forged, &p2)
	if kindOf(err) != KindMismatch || !strings.Contains(err.Error(), "RTMR1 (event log replay) mismatch") {
		t.Errorf("an altered kernel event: %v, want an RTMR1 replay mismatch", err)
	}
	// An event dropped from RTMR0.
	log, _ := tdx.ParseEventLog(ccel)
	short, _ := tdx.MarshalEventLog(log.Events[1:])
	if _, err := v.VerifyTDXEvidence(quote, short, p); kindOf(err) != KindMismatch || !strings.Contains(err.Error(), "RTMR0 (event log replay)") {
		t.Errorf("a dropped event: %v", err)
	}
	if _, err := v.VerifyTDXEvidence(quote, nil, p); kindOf(err) != KindPolicy || !strings.Contains(err.Error(), "CC event log") {
		t.Errorf("no event log: %v", err)
	}
	if _, err := v.VerifyTDXEvidence(quote, ccel[:200], p); kindOf(err) != KindFormat {
		t.Errorf("a truncated event log: %v", err)
	}
}

// The verifier refuses events a direct boot of the manifest's image never
// measures, each by its RTMR and position (synthetic logs: the genuine
// kernel events with one extra record).
func TestTDXEventLogUnexpectedEvents(t *testing.T) {
	boot := dstackBoot(t)
	base := []tdx.LogEvent{
		{MRIndex: 2, Type: tdx.EvEFIBootServicesApplication, Digest: boot.Kernel},
		{MRIndex: 3, Type: tdx.EvEventTag, Digest: boot.LoadOptions, Data: tagData(tdx.TagLinuxLoadOptions)},
		{MRIndex: 3, Type: tdx.EvEventTag, Digest: boot.Initrd, Data: tagData(tdx.TagLinuxInitrd)},
	}
	check := func(events []tdx.LogEvent) error {
		raw, err := tdx.MarshalEventLog(events)
		if err != nil {
			t.Fatal(err)
		}
		log, _ := tdx.ParseEventLog(raw)
		r := log.Replay()
		return checkMeasuredBoot([][]byte{r[0][:], r[1][:], r[2][:], r[3][:]}, raw, boot)
	}
	if err := check(base); err != nil {
		t.Fatalf("the expected events: %v", err)
	}
	for name, c := range map[string]struct {
		ev   tdx.LogEvent
		want string
	}{
		"a boot loader":   {tdx.LogEvent{MRIndex: 2, Type: tdx.EvEFIBootServicesApplication, Digest: sum384([]byte("grub"))}, "RTMR1 event 4 (EV_EFI_BOOT_SERVICES_APPLICATION, unexpected)"},
		"a forged action": {tdx.LogEvent{MRIndex: 2, Type: tdx.EvEFIAction, Digest: sum384([]byte("x")), Data: []byte("Exit Boot Services Invocation")}, "RTMR1 event 4 (EV_EFI_ACTION, unexpected)"},
		"an IPL event":    {tdx.LogEvent{MRIndex: 3, Type: 0x0D, Digest: sum384([]byte("grub cmd"))}, "RTMR2 event 4 (event type 0xd, unexpected)"},
		"a second cmdline": {tdx.LogEvent{MRIndex: 3, Type: tdx.EvEventTag, Digest: boot.LoadOptions, Data: tagData(tdx.TagLinuxLoadOptions)},
			"RTMR2 event 4 (EV_EVENT_TAG, unexpected)"},
	} {
		err := check(append(append([]tdx.LogEvent(nil), base...), c.ev))
		var e *Error
		if !errors.As(err, &e) || e.Field != c.want {
			t.Errorf("%s: %v, want %s", name, err, c.want)
		}
	}
	if err := check(base[:1]); err == nil || !strings.Contains(err.Error(), "Linux 6.9") {
		t.Errorf("no command line event: %v", err)
	}
}

func tagData(id uint32) []byte {
	b := []byte{byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24), 1, 0, 0, 0, 0}
	return b
}

// TEE_TCB_SVN below the policy's minimum is refused; unset, not checked.
func TestTDXMinTEETCBSVN(t *testing.T) {
	quote, p := dstackQuote(t)
	v := tdxVerifierAt(t, dstackTime, nil)
	q, _ := ParseTDXQuote(quote)
	svn := q.GetTdQuoteBody().GetTeeTcbSvn()
	p.MinTEETCBSVN = bytes.Clone(svn)
	if _, err := v.VerifyTDX(quote, p); err != nil {
		t.Fatalf("the quote's own TEE_TCB_SVN as minimum: %v", err)
	}
	p.MinTEETCBSVN[2]++
	_, err := v.VerifyTDX(quote, p)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindPolicy || e.Field != "TEE_TCB_SVN" {
		t.Fatalf("a higher minimum: %v", err)
	}
	t.Log(err)
	p.MinTEETCBSVN = Hex{1}
	if _, err := v.VerifyTDX(quote, p); kindOf(err) != KindConfig {
		t.Errorf("a 1-byte minimum: %v", err)
	}
}

func FuzzCheckMeasuredBoot(f *testing.F) {
	f.Add(dstackCCEL(f)[:4096])
	boot := dstackBoot(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		log, err := tdx.ParseEventLog(b)
		if err != nil {
			return
		}
		r := log.Replay()
		_ = checkMeasuredBoot([][]byte{r[0][:], r[1][:], r[2][:], r[3][:]}, b, boot)
	})
}
