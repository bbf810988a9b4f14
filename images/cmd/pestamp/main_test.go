package main

import (
	"encoding/binary"
	"os"
	"testing"
)

// The checksum of objcopy's own output must be what checksum computes for
// it: Debian's systemd-boot stub carries one written by the linker.
func TestChecksumMatchesTheLinkers(t *testing.T) {
	b, err := os.ReadFile("/usr/lib/systemd/boot/efi/linuxx64.efi.stub")
	if err != nil {
		t.Fatalf("%v: run make deps (systemd-boot-efi)", err)
	}
	pe := int(binary.LittleEndian.Uint32(b[0x3c:]))
	field := pe + 24 + 64
	want := binary.LittleEndian.Uint32(b[field:])
	if want == 0 {
		t.Fatal("the stub has no checksum to compare with")
	}
	if got := checksum(b, field); got != want {
		t.Fatalf("checksum = %#x, the stub's header says %#x", got, want)
	}
}

func TestSetStamp(t *testing.T) {
	b, err := os.ReadFile("/usr/lib/systemd/boot/efi/linuxx64.efi.stub")
	if err != nil {
		t.Fatalf("%v: run make deps (systemd-boot-efi)", err)
	}
	c := append([]byte(nil), b...)
	if err := setStamp(c, 1234); err != nil {
		t.Fatal(err)
	}
	pe := int(binary.LittleEndian.Uint32(c[0x3c:]))
	if got := binary.LittleEndian.Uint32(c[pe+8:]); got != 1234 {
		t.Fatalf("TimeDateStamp = %d", got)
	}
	if got, want := binary.LittleEndian.Uint32(c[pe+24+64:]), checksum(c, pe+24+64); got != want {
		t.Fatalf("CheckSum %#x, want %#x", got, want)
	}
	if err := setStamp([]byte("not a PE file at all, but long enough to have a header.........."), 0); err == nil {
		t.Fatal("a non-PE file was stamped")
	}
}
