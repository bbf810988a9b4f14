// Package teeparam is the contract between the launcher, the image build
// and the guest for the kernel parameter that names the pod VM's trusted
// execution environment:
//
//	c8s.tee=sim | c8s.tee=snp | c8s.tee=tdx
//
// Each TEE backend of the launcher puts its own parameter on the kernel
// command line (launcher/vm/tee), so it is part of the launch measurement
// (SNP kernel hashes, TDX RTMR2, the sim TEE's digest) and the image
// build records each TEE's digests over its own command line. The guest
// reads it to pick its attestation provider (guest/attest.Detect): a VM
// started as snp or tdx never takes evidence from the host-served sim
// port, and a missing TEE device fails closed. It also checks it against
// the hardware its kernel runs in (guest/attest.StartedAs): an SNP or TDX
// VM started as sim, or a VM started as snp or tdx without that hardware,
// powers itself off. The host cannot change the
// parameter without changing the measurement the relying party checks.
package teeparam

import (
	"fmt"
	"slices"
	"strings"
)

// Key is the parameter's name.
const Key = "c8s.tee"

// The TEEs, as launcher hypervisor.tee names them.
const (
	Sim = "sim"
	SNP = "snp"
	TDX = "tdx"
)

// Names lists the TEEs the parameter can name, sorted.
var Names = []string{Sim, SNP, TDX}

// Known reports whether tee is one of Names.
func Known(tee string) bool { return slices.Contains(Names, tee) }

// Format returns the parameter naming tee: "c8s.tee=<tee>".
func Format(tee string) string { return Key + "=" + tee }

// FromCmdline returns the TEE a kernel command line names. ok is false when
// the command line has no c8s.tee parameter (a VM started by a launcher
// that predates it, or not by c8s at all). An unknown value, or the
// parameter given more than once, is an error: a guest must not guess
// which TEE it was started as.
func FromCmdline(cmdline string) (tee string, ok bool, err error) {
	for _, f := range strings.Fields(cmdline) {
		k, v, hasValue := strings.Cut(f, "=")
		if k != Key {
			continue
		}
		if ok {
			return "", true, fmt.Errorf("%s is given more than once on the kernel command line (%s, then %s)", Key, Format(tee), f)
		}
		if !hasValue || !Known(v) {
			return "", true, fmt.Errorf("%s: unknown TEE %q on the kernel command line; known TEEs are %s", Key, v, strings.Join(Names, ", "))
		}
		tee, ok = v, true
	}
	return tee, ok, nil
}
