package sim

import (
	"bytes"
	"crypto/sha512"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/c8s-dev/c8s/measurements/tdx"
)

// bootLogFromBytes is BootLog over files read whole: what BootLog must
// equal.
func bootLogFromBytes(t *testing.T, l Launch) ([]byte, [4][48]byte) {
	t.Helper()
	read := func(p string) []byte {
		if p == "" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	fw := sha512.Sum384(read(l.Firmware))
	events := []tdx.LogEvent{{MRIndex: tdx.MRIndexRTMR0, Type: tdx.EvEFIPlatformFirmwareBlob2, Digest: fw[:], Data: []byte(firmwareEventData)}}
	boot, err := tdx.DirectBoot{Kernel: read(l.Kernel), Cmdline: l.Cmdline, Initrd: read(l.Initrd)}.LogEvents()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := tdx.MarshalEventLog(append(events, boot...))
	if err != nil {
		t.Fatal(err)
	}
	log, err := tdx.ParseEventLog(raw)
	if err != nil {
		t.Fatal(err)
	}
	return raw, log.Replay()
}

// BootLog hashes the kernel and initrd through mappings of the files: the
// shim's heap does not grow by their size (issue 18: a sim pod's shim
// read ~35 MB whole at start), and the log is the one the files' bytes
// give, also for an empty initrd.
func TestBootLogMapsTheFiles(t *testing.T) {
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		t.Fatal("no /boot/vmlinuz-* (Debian package linux-image-amd64; run hack/install-deps.sh)")
	}
	dir := t.TempDir()
	write := func(name string, size int) string {
		p := filepath.Join(dir, name)
		b := bytes.Repeat([]byte{0xc8}, size)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const initrdSize = 32 << 20
	l := Launch{Firmware: write("bios.bin", 256<<10), Kernel: kernels[0], Initrd: write("initrd.img", initrdSize), Cmdline: "console=ttyS0"}

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	raw, rtmrs, err := BootLog(l)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > initrdSize/4 {
		t.Errorf("BootLog allocated %d bytes for a %d-byte initrd: it must hash the files through mappings, not read them whole", alloc, initrdSize)
	}
	wantRaw, wantRTMRs := bootLogFromBytes(t, l)
	if !bytes.Equal(raw, wantRaw) || rtmrs != wantRTMRs {
		t.Fatal("BootLog differs from the log of the files' bytes")
	}

	l.Initrd = write("empty.img", 0)
	raw, rtmrs, err = BootLog(l)
	if err != nil {
		t.Fatal(err)
	}
	if wantRaw, wantRTMRs := bootLogFromBytes(t, l); !bytes.Equal(raw, wantRaw) || rtmrs != wantRTMRs {
		t.Fatal("BootLog of an empty initrd differs from the log of its (no) bytes")
	}
	if _, _, err := BootLog(Launch{Firmware: l.Firmware, Kernel: filepath.Join(dir, "missing")}); err == nil {
		t.Fatal("BootLog of a missing kernel: no error")
	}
}
