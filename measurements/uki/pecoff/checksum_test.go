package pecoff

import (
	"bytes"
	"os"
	"testing"
)

// The checksum of objcopy's own output must be what ComputeCheckSum
// computes for it: Debian's systemd-boot stub carries one written by the
// linker.
func TestCheckSumMatchesTheLinkers(t *testing.T) {
	b, err := os.ReadFile("/usr/lib/systemd/boot/efi/linuxx64.efi.stub")
	if err != nil {
		t.Fatalf("%v: run make deps (systemd-boot-efi)", err)
	}
	f, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	want := f.CheckSum()
	if want == 0 {
		t.Fatal("the stub has no checksum to compare with")
	}
	if got := f.ComputeCheckSum(); got != want {
		t.Fatalf("ComputeCheckSum = %#x, the stub's header says %#x", got, want)
	}
}

func TestSetTimeDateStamp(t *testing.T) {
	b, err := os.ReadFile("/usr/lib/systemd/boot/efi/linuxx64.efi.stub")
	if err != nil {
		t.Fatalf("%v: run make deps (systemd-boot-efi)", err)
	}
	c := bytes.Clone(b)
	f, err := Parse(c)
	if err != nil {
		t.Fatal(err)
	}
	f.SetTimeDateStamp(1234)
	if got := f.TimeDateStamp(); got != 1234 {
		t.Fatalf("TimeDateStamp = %d", got)
	}
	if got, want := f.CheckSum(), f.ComputeCheckSum(); got != want {
		t.Fatalf("CheckSum %#x, want %#x", got, want)
	}
	// The stamp and the checksum are the only bytes that change.
	diff := 0
	for i := range b {
		if b[i] != c[i] {
			diff++
		}
	}
	if diff == 0 || diff > 8 {
		t.Fatalf("%d bytes changed, want the stamp's and the checksum's (at most 8)", diff)
	}
}
