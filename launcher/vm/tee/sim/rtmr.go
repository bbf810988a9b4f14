package sim

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha512"
	"errors"
	"fmt"
	"os"

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
	read := func(path, what string) ([]byte, error) {
		if path == "" {
			return nil, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("sim: boot log: %s: %w", what, err)
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
