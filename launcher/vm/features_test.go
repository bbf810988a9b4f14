package vm

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/vm/testguest"
)

func TestCheckQEMUFeatures(t *testing.T) {
	qemu := testguest.QEMU(t)
	ctx := context.Background()
	if err := CheckQEMUFeatures(ctx, qemu, nil); err != nil {
		t.Fatalf("no features: %v", err)
	}
	// Every QEMU the launcher supports has these object types.
	if err := CheckQEMUFeatures(ctx, qemu, []string{"rng-random", "memory-backend-ram"}); err != nil {
		t.Fatalf("basic object types: %v", err)
	}
	err := CheckQEMUFeatures(ctx, qemu, []string{"rng-random", "c8s-no-such-object"})
	if err == nil || !strings.Contains(err.Error(), "c8s-no-such-object") || strings.Contains(err.Error(), "rng-random") {
		t.Fatalf("missing object type: err = %v, want it to name only the missing type", err)
	}
}

func TestParseQEMUVersion(t *testing.T) {
	for out, want := range map[string]QEMUVersion{
		"QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)\nCopyright (c) 2003-2022": {7, 2, 19},
		"QEMU emulator version 9.2.0":                            {9, 2, 0},
		"QEMU emulator version 10.1.50 (v10.1.0-1234-gdeadbeef)": {10, 1, 50},
		"QEMU emulator version 8.0":                              {8, 0, 0},
	} {
		got, err := ParseQEMUVersion(out)
		if err != nil || got != want {
			t.Errorf("ParseQEMUVersion(%q) = %v, %v; want %v", out, got, err, want)
		}
	}
	if _, err := ParseQEMUVersion("qemu-img version 7.2.0"); err == nil {
		t.Error("qemu-img output parsed as a QEMU system emulator version")
	}
	if !(QEMUVersion{7, 2, 19}).Less(QEMUVersion{9, 2, 0}) || (QEMUVersion{10, 0, 0}).Less(QEMUVersion{9, 2, 0}) ||
		(QEMUVersion{9, 2, 0}).Less(QEMUVersion{9, 2, 0}) {
		t.Error("QEMUVersion.Less is wrong")
	}
}

func TestRequireNamesTheReleaseThatBroughtAType(t *testing.T) {
	old := &QEMUFeatures{Path: "/usr/bin/qemu", Version: QEMUVersion{7, 2, 19}, Objects: map[string]bool{"sev-guest": true}}
	err := old.Require([]string{"sev-guest", "igvm-cfg", "sev-snp-guest"})
	want := "QEMU 7.2.19 (/usr/bin/qemu) has no igvm-cfg; need ≥ 10.1, no sev-snp-guest; need ≥ 9.1"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want it to contain %q", err, want)
	}
	// A new enough QEMU built without the feature is told apart.
	noIGVM := &QEMUFeatures{Path: "q", Version: QEMUVersion{10, 1, 0}, Objects: map[string]bool{}}
	if err := noIGVM.Require([]string{"igvm-cfg"}); err == nil || !strings.Contains(err.Error(), "built without") {
		t.Fatalf("err = %v, want 'built without'", err)
	}
	if err := old.Require([]string{"sev-guest"}); err != nil {
		t.Fatalf("a type QEMU has: %v", err)
	}
}

func TestProbeQEMUOfTheInstalledQEMU(t *testing.T) {
	qemu := testguest.QEMU(t)
	f, err := ProbeQEMU(context.Background(), qemu)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version.Major < 7 || !f.Objects["memory-backend-ram"] {
		t.Fatalf("probe of %s: version %v, memory-backend-ram %v", qemu, f.Version, f.Objects["memory-backend-ram"])
	}
	// This host's QEMU (Debian 12: 7.2) has no igvm-cfg; the launcher must
	// say which release it needs.
	if f.Objects["igvm-cfg"] {
		return
	}
	err = CheckQEMUFeatures(context.Background(), qemu, []string{"igvm-cfg"})
	want := fmt.Sprintf("QEMU %s (%s) has no igvm-cfg; need ≥ 10.1", f.Version, qemu)
	if f.Version.Less(MinQEMU["igvm-cfg"]) && (err == nil || !strings.Contains(err.Error(), want)) {
		t.Fatalf("err = %v, want it to contain %q", err, want)
	}
}
