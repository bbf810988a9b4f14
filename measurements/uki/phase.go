package uki

import (
	"fmt"
	"strings"
)

// DefaultPhases are the boot phase paths `systemd-measure calculate`
// reports by default: the words systemd-pcrphase extends into PCR 11 as
// the boot goes on, colon-separated, cumulative.
var DefaultPhases = []string{
	"enter-initrd",
	"enter-initrd:leave-initrd",
	"enter-initrd:leave-initrd:sysinit",
	"enter-initrd:leave-initrd:sysinit:ready",
}

// PhaseValue is PCR 11 after a boot phase path, per bank.
type PhaseValue struct {
	Phase string
	PCR11 map[Bank][]byte
}

// ExtendPhase returns pcr (a PCR 11 value in bank b, as systemd-stub left
// it) after systemd-pcrphase measured each word of the colon-separated
// phase path: one extend per word with the digest of the word, without a
// terminating NUL. An empty phase leaves pcr unchanged.
func ExtendPhase(b Bank, pcr []byte, phase string) ([]byte, error) {
	if phase == "" {
		return pcr, nil
	}
	h, err := b.New()
	if err != nil {
		return nil, err
	}
	for _, w := range strings.Split(phase, ":") {
		if w == "" {
			return nil, fmt.Errorf("uki: phase path %q has an empty word", phase)
		}
		h.Reset()
		h.Write([]byte(w))
		pcr = Extend(b, pcr, h.Sum(nil))
	}
	return pcr, nil
}

// phaseValues computes PCR 11 after each of the DefaultPhases.
func phaseValues(stub map[Bank][]byte) ([]PhaseValue, error) {
	var out []PhaseValue
	for _, p := range DefaultPhases {
		v := PhaseValue{Phase: p, PCR11: map[Bank][]byte{}}
		for _, b := range Banks {
			pcr, err := ExtendPhase(b, stub[b], p)
			if err != nil {
				return nil, err
			}
			v.PCR11[b] = pcr
		}
		out = append(out, v)
	}
	return out, nil
}
