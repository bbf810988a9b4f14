package reattest

import (
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

// The node's minimum and the owner's bundle combine and judge a TCB byte
// by byte: on Turin, tee and snp are bytes 2 and 3, which Milan's layout
// reserves, and a combination or comparison in Milan's layout dropped
// them.
func TestTCBMinimumOnTurin(t *testing.T) {
	turin := func(fmc, bl, tee, snp, ucode uint8) TCB {
		return TCB(snpext.TCB{Line: snpext.Turin, FMC: fmc, Bootloader: bl, TEE: tee, SNP: snp, Microcode: ucode}.Raw())
	}
	node, owner := turin(0, 1, 0, 2, 71), turin(1, 1, 0, 5, 60)
	if got, want := maxTCB(node, owner), turin(1, 1, 0, 5, 71); got != want {
		t.Fatalf("maxTCB = %s, want %s", got, want)
	}
	id := &Identity{TEE: "snp", TCB: turin(1, 1, 0, 3, 71)}
	fails := nodeFailures(id, &Bundle{Serial: 1, MinTCB: owner}, uint64(node))
	if len(fails) != 1 || fails[0].reason != ReasonTCBBelowMinimum || !strings.Contains(fails[0].message, "bundle serial 1") {
		t.Fatalf("snp 3 under a minimum of snp 5: %+v", fails)
	}
	id.TCB, id.LaunchTCB = turin(1, 1, 0, 5, 71), turin(1, 1, 0, 5, 71)
	if fails := nodeFailures(id, &Bundle{Serial: 1, MinTCB: owner}, uint64(node)); len(fails) != 0 {
		t.Fatalf("at the minimum: %+v", fails)
	}
	// Launched below the minimum, the firmware updated live since.
	id.LaunchTCB = turin(1, 1, 0, 2, 71)
	fails = nodeFailures(id, &Bundle{Serial: 1, MinTCB: owner}, uint64(node))
	if len(fails) != 1 || fails[0].reason != ReasonTCBBelowMinimum || !strings.Contains(fails[0].message, "LAUNCH_TCB") {
		t.Fatalf("launched under snp 2, the minimum snp 5: %+v", fails)
	}
	if tcbAtLeast(turin(1, 1, 0, 5, 71), turin(1, 1, 1, 5, 71)) {
		t.Error("tee 0 taken as at least tee 1")
	}
}
