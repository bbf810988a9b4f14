package tdx

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

// Trustee's deps/eventlog test: the RTMRs its replay of CCEL_data_ovmf (a
// genuine OVMF direct-boot TD's CCEL) must give (testdata/trustee/README.md).
var trusteeOVMFRTMRs = [3]string{
	"8566f998798db09443b244c62de9a3041fb02e2e6936c4396d784bba2e90177329ec5aba3bb484404f2ab9cc90abe193",
	"775b9f6bfe99f8a31396f0d0218e67ffa796d3b96ccf961cbb0deba48c79c00f082cda1a5567c1c16305f1fc210c13c6",
	"94eaf7a7bf398ed8d888c91057ae0261802e4f3df084213a76ca7f0b5055ac9d2241de43cd58d9e8b49c503bbf25f34a",
}

func readCCEL(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/trustee/CCEL_data_ovmf")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseGenuineOVMFLog(t *testing.T) {
	log, err := ParseEventLog(readCCEL(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Events) != 20 {
		t.Errorf("%d events, want the 20 Trustee's parser finds", len(log.Events))
	}
	got := log.Replay()
	for i, want := range trusteeOVMFRTMRs {
		if hex.EncodeToString(got[i][:]) != want {
			t.Errorf("RTMR%d = %x, want %s", i, got[i], want)
		}
	}
	if got[3] != ([48]byte{}) || log.HasEvents(3) {
		t.Errorf("RTMR3 = %x", got[3])
	}
	// The shapes a verifier looks for: one kernel image in RTMR1, the
	// EFI stub's load options and initrd tags in RTMR2.
	var kernels, tags int
	for _, e := range log.Events {
		switch {
		case e.Type == EvEFIBootServicesApplication && e.RTMR() == 1:
			kernels++
		case e.Type == EvEventTag && e.RTMR() == 2:
			if id, _, ok := e.Tag(); ok && (id == TagLinuxLoadOptions || id == TagLinuxInitrd) {
				tags++
			}
		}
	}
	if kernels != 1 || tags != 2 {
		t.Errorf("kernel events %d, EFI stub tags %d; want 1 and 2", kernels, tags)
	}
}

// One changed digest byte changes the replay; one changed length byte is
// a parse error or a different log, never the same RTMRs.
func TestEventLogTampering(t *testing.T) {
	b := readCCEL(t)
	log, err := ParseEventLog(b)
	if err != nil {
		t.Fatal(err)
	}
	want := log.Replay()
	bad := bytes.Clone(b)
	i := bytes.Index(bad, log.Events[11].Digest) // the kernel image
	bad[i] ^= 1
	l2, err := ParseEventLog(bad)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Replay() == want {
		t.Error("a changed kernel digest replays to the same RTMRs")
	}
	// Garbage after the last event is refused, not ignored.
	end := bytes.Clone(b)
	k := len(bytes.TrimRight(b, "\xff")) // where the fill starts
	end[k+100] = 0
	if _, err := ParseEventLog(end); err == nil {
		t.Error("data hidden in the fill was accepted")
	}
}

// MarshalEventLog and ParseEventLog agree, and a direct boot's log events
// replay to its predicted RTMR1 and RTMR2.
func TestDirectBootLogRoundTrip(t *testing.T) {
	b := DirectBoot{Kernel: testPE(t), Cmdline: "console=hvc0 c8s.tee=tdx", Initrd: []byte("initrd bytes")}
	events, err := b.LogEvents()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := MarshalEventLog(events)
	if err != nil {
		t.Fatal(err)
	}
	log, err := ParseEventLog(append(raw, bytes.Repeat([]byte{0xff}, 4096)...))
	if err != nil {
		t.Fatal(err)
	}
	r1, err := b.RTMR1()
	if err != nil {
		t.Fatal(err)
	}
	got := log.Replay()
	if got[1] != r1.Value || got[2] != b.RTMR2().Value || got[0] != ([48]byte{}) {
		t.Errorf("replay %x, want RTMR1 %x RTMR2 %x", got, r1.Value, b.RTMR2().Value)
	}
	for i, e := range log.Events {
		if e.Type != events[i].Type || e.MRIndex != events[i].MRIndex || !bytes.Equal(e.Data, events[i].Data) || e.Seq != i+1 {
			t.Errorf("event %d: %+v, want %+v", i+1, e, events[i])
		}
	}
}

func TestParseEventLogErrors(t *testing.T) {
	good, err := MarshalEventLog([]LogEvent{{MRIndex: MRIndexRTMR1, Type: EvSeparator, Digest: make([]byte, 48), Data: make([]byte, 4)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseEventLog(good); err != nil {
		t.Fatal(err)
	}
	mrtd := bytes.Clone(good)
	mrtd[len(mrtd)-4-4-48-2-4-4-4] = MRIndexMRTD // the event's index field
	for name, b := range map[string][]byte{
		"empty":          nil,
		"truncated":      good[:len(good)-3],
		"not a spec ID":  append(bytes.Clone(good[:32]), bytes.Repeat([]byte{1}, 64)...),
		"MRTD extension": mrtd,
	} {
		if _, err := ParseEventLog(b); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func FuzzParseEventLog(f *testing.F) {
	f.Add(readCCEL(f)[:4096])
	good, _ := MarshalEventLog([]LogEvent{{MRIndex: MRIndexRTMR2, Type: EvEventTag, Digest: make([]byte, 48), Data: taggedEvent(TagLinuxInitrd, "x")}})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		log, err := ParseEventLog(b)
		if err != nil {
			return
		}
		log.Replay()
		for _, e := range log.Events {
			e.Tag()
			if e.Type != EvNoAction && (e.RTMR() < 0 || len(e.Digest) != 48) {
				t.Fatalf("accepted event %+v", e)
			}
		}
	})
}

// testPE returns a real PE kernel: Debian's, which make deps installs.
func testPE(t testing.TB) []byte {
	t.Helper()
	m, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(m) == 0 {
		t.Fatal("no /boot/vmlinuz-* (Debian package linux-image-amd64; run hack/install-deps.sh)")
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	return b
}
