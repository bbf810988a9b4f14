package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/c8s-dev/c8s/measurements/uki/pecoff"
)

func TestStamp(t *testing.T) {
	b, err := os.ReadFile("/usr/lib/systemd/boot/efi/linuxx64.efi.stub")
	if err != nil {
		t.Fatalf("%v: run make deps (systemd-boot-efi)", err)
	}
	path := filepath.Join(t.TempDir(), "stub.efi")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := stamp(path, 1234); err != nil {
		t.Fatal(err)
	}
	c, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := pecoff.Parse(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.TimeDateStamp(); got != 1234 {
		t.Fatalf("TimeDateStamp = %d", got)
	}
	if got, want := f.CheckSum(), f.ComputeCheckSum(); got != want || got == 0 {
		t.Fatalf("CheckSum %#x, want %#x", got, want)
	}
	if len(c) != len(b) {
		t.Fatalf("stamping changed the size from %d to %d bytes", len(b), len(c))
	}
	if err := setStamp([]byte("not a PE file at all, but long enough to have a header.........."), 0); err == nil {
		t.Fatal("a non-PE file was stamped")
	}
}
