package sim

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha512"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/launcher/vm/tee/sim/simtrust"
	"github.com/c8s-dev/c8s/measurements/tdx"
)

// The sim TEE models TDX's runtime measurement registers, so that a sim
// pod runs the verifier's measured-boot code path (launcher/attest: event
// log replay, kernel, command line and initrd events) as a TDX pod does.
// Where a TD's firmware and kernel extend RTMRs as they boot, the
// simulated secure processor computes them from what the VM is launched
// with: RTMR0 holds one record of the firmware image, RTMR1 and RTMR2 the
// records OVMF and the kernel's EFI stub make for a direct boot of the
// kernel, command line and initrd (measurements/tdx DirectBoot.LogEvents),
// RTMR3 is zero. The registers are bound to a report by an RTMR statement
// the VCEK signs.

// RTMRStatementMagic starts every RTMR statement (simtrust, where the
// verifier parses them).
const RTMRStatementMagic = simtrust.RTMRStatementMagic

// firmwareEventData is the data of the sim boot's firmware record.
const firmwareEventData = "c8s sim firmware image"

// BootLog returns the sim boot's CC event log for l and the RTMRs it
// replays to. The kernel must be a PE image (an EFI-stub kernel), as OVMF
// loads nothing else.
func BootLog(l Launch) ([]byte, [4][48]byte, error) {
	var rtmrs [4][48]byte
	// The files are mapped, not read: a kernel and initrd are tens of MB,
	// which os.ReadFile would add to the shim's heap (and its RSS until
	// the runtime hands the pages back); mapped pages are the page
	// cache's, and leave the shim's RSS at unmap.
	var maps [][]byte
	defer func() {
		for _, m := range maps {
			_ = unix.Munmap(m)
		}
	}()
	read := func(path, what string) ([]byte, error) {
		if path == "" {
			return nil, nil
		}
		b, err := mapFile(path)
		if err != nil {
			return nil, fmt.Errorf("sim: boot log: %s: %w", what, err)
		}
		if len(b) > 0 {
			maps = append(maps, b)
		}
		return b, nil
	}
	fw, err := read(l.Firmware, "firmware")
	if err != nil {
		return nil, rtmrs, err
	}
	kernel, err := read(l.Kernel, "kernel")
	if err != nil {
		return nil, rtmrs, err
	}
	initrd, err := read(l.Initrd, "initrd")
	if err != nil {
		return nil, rtmrs, err
	}
	fwDigest := sha512.Sum384(fw)
	events := []tdx.LogEvent{{MRIndex: tdx.MRIndexRTMR0, Type: tdx.EvEFIPlatformFirmwareBlob2, Digest: fwDigest[:], Data: []byte(firmwareEventData)}}
	boot, err := tdx.DirectBoot{Kernel: kernel, Cmdline: l.Cmdline, Initrd: initrd}.LogEvents()
	if err != nil {
		return nil, rtmrs, fmt.Errorf("sim: boot log: %w", err)
	}
	raw, err := tdx.MarshalEventLog(append(events, boot...))
	if err != nil {
		return nil, rtmrs, err
	}
	log, err := tdx.ParseEventLog(raw)
	if err != nil {
		return nil, rtmrs, err
	}
	return raw, log.Replay(), nil
}

// mapFile maps path read-only whole; an empty file is an empty, unmapped
// slice (mmap refuses a zero length), as os.ReadFile returns it. The
// caller unmaps a non-empty one.
func mapFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() == 0 {
		return []byte{}, nil
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return b, nil
}

// RTMRStatement binds rtmrs to report (the signed report bytes) and signs
// them with the VCEK: magic, SHA-384(report), RTMR0-3, then the ECDSA
// P-384 signature (ASN.1) over the SHA-384 of those.
func (sp *SP) RTMRStatement(report []byte, rtmrs [4][48]byte) ([]byte, error) {
	if len(report) == 0 {
		return nil, errors.New("sim: no report to bind the RTMRs to")
	}
	b := []byte(RTMRStatementMagic)
	rd := sha512.Sum384(report)
	b = append(b, rd[:]...)
	for _, r := range rtmrs {
		b = append(b, r[:]...)
	}
	d := sha512.Sum384(b)
	sig, err := ecdsa.SignASN1(rand.Reader, sp.keys.vcek, d[:])
	if err != nil {
		return nil, fmt.Errorf("sim: signing the RTMRs: %w", err)
	}
	return append(b, sig...), nil
}

// ParseRTMRStatement splits a statement into the SHA-384 of the report it
// binds, the RTMRs, the signed bytes and the signature; it verifies
// nothing (simtrust.ParseRTMRStatement).
func ParseRTMRStatement(b []byte) (reportDigest [48]byte, rtmrs [4][48]byte, signed, sig []byte, err error) {
	return simtrust.ParseRTMRStatement(b)
}
