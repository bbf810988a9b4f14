//go:build linux

package main

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestSevHashFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "kernel")
	data := []byte(strings.Repeat("kernel bytes ", 100000))
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := sevHashFile(p)
	if err != nil || got != sha256.Sum256(data) {
		t.Fatalf("sevHashFile = %x, %v", got, err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := sevHashFile(empty); err != nil || got != sha256.Sum256(nil) {
		t.Fatalf("empty file: %x, %v", got, err)
	}
	if _, err := sevHashFile(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Fatal("absent file hashed")
	}
}

// TestSevHashMappedTruncated checks that a file truncated under its mapping
// gives an error, not a SIGBUS crash.
func TestSevHashMappedTruncated(t *testing.T) {
	p := filepath.Join(t.TempDir(), "initrd")
	if err := os.WriteFile(p, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, err := syscall.Mmap(int(f.Fd()), 0, 1<<20, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer syscall.Munmap(data)
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := sevHashMapped(data, p); err == nil || !strings.Contains(err.Error(), "changed while") {
		t.Fatalf("truncated mapping: err = %v", err)
	}
}
