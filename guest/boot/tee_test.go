package boot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/guest/attest"
)

// fakeHardware is an attest.Hardware in the hardware TEE tee ("" for none).
type fakeHardware string

func (f fakeHardware) TEE() (string, string, error) {
	return string(f), "the fake's " + string(f), nil
}

// setHardware makes startedAs see hw until the test ends.
func setHardware(t *testing.T, hw attest.Hardware) {
	t.Helper()
	saved := hardware
	hardware = hw
	t.Cleanup(func() { hardware = saved })
}

// The guest takes the TEE it was started as from its kernel command line,
// once its hardware agrees; a line it cannot read or a bad value is an
// error, never "no TEE".
func TestStartedAs(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		cmdline string
		hw      fakeHardware
		want    string
		err     string
	}{
		{"console=ttyS0 quiet panic=-1 no_timer_check c8s.tee=snp\n", "snp", "snp", ""},
		{"console=ttyS0 c8s.tee=tdx c8s.log_level=debug\n", "tdx", "tdx", ""},
		{"console=ttyS0 c8s.tee=sim\n", "", "sim", ""},
		{"console=ttyS0 panic=-1\n", "", "", ""},
		{"console=ttyS0 c8s.tee=none\n", "", "", `unknown TEE "none"`},
		{"c8s.tee=snp c8s.tee=sim\n", "snp", "", "more than once"},
		// The host's attack: an SNP or TDX VM started as sim.
		{"console=ttyS0 c8s.tee=sim\n", "snp", "", "started as sim"},
		{"console=ttyS0 c8s.tee=sim\n", "tdx", "", "started as sim"},
		{"console=ttyS0 c8s.tee=snp\n", "", "", "does not run in AMD SEV-SNP"},
	} {
		setHardware(t, tc.hw)
		path := filepath.Join(dir, "cmdline")
		if err := os.WriteFile(path, []byte(tc.cmdline), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := startedAs(path)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("startedAs(%q) in %q hardware = %q, %v; want an error with %q", tc.cmdline, tc.hw, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("startedAs(%q) in %q hardware = %q, %v; want %q", tc.cmdline, tc.hw, got, err, tc.want)
		}
	}
	if _, err := startedAs(filepath.Join(dir, "missing")); err == nil {
		t.Error("an unreadable command line passed as naming no TEE")
	}
}

// The guest's own hardware is the kernel's view of it below "/".
func TestHardwareIsTheKernels(t *testing.T) {
	if hardware != (attest.KernelHardware{Root: "/"}) {
		t.Fatalf("startedAs checks %#v, want the kernel's view below /", hardware)
	}
}

// The TEE guest drivers are loaded for the hardware TEEs and for a VM that
// names none (the drivers tell), never for sim (its secure processor is a
// port) nor outside PID 1.
func TestTEEModules(t *testing.T) {
	for _, tc := range []struct {
		pid1 bool
		tee  string
		load bool
	}{
		{true, "snp", true}, {true, "tdx", true}, {true, "", true},
		{true, "sim", false}, {false, "snp", false},
	} {
		loaded := false
		if f := teeModules(tc.pid1, tc.tee, func() { loaded = true }); f != nil {
			f()
		}
		if loaded != tc.load {
			t.Errorf("teeModules(pid1=%v, %q) loads the drivers: %v, want %v", tc.pid1, tc.tee, loaded, tc.load)
		}
	}
}

// Only a VM started as sim takes its first entropy from the host's
// virtio-rng: a hardware TEE's host is the adversary, and its kernel is
// seeded by the CPU. A VM that names no TEE is treated as hardware.
func TestHostEntropy(t *testing.T) {
	for _, tc := range []struct {
		tee  string
		load bool
	}{
		{"sim", true}, {"snp", false}, {"tdx", false}, {"", false},
	} {
		loaded := false
		if f := hostEntropy(tc.tee, func() { loaded = true }); f != nil {
			f()
		}
		if loaded != tc.load {
			t.Errorf("hostEntropy(%q) loads virtio-rng: %v, want %v", tc.tee, loaded, tc.load)
		}
	}
}

// Only a VM started as sim loads the free page reporting balloon driver:
// an SNP or TDX guest binds no balloon the host offers.
func TestFreePageReporting(t *testing.T) {
	for _, tc := range []struct {
		tee  string
		load bool
	}{
		{"sim", true}, {"snp", false}, {"tdx", false}, {"", false},
	} {
		loaded := false
		if f := freePageReporting(tc.tee, func() { loaded = true }); f != nil {
			f()
		}
		if loaded != tc.load {
			t.Errorf("freePageReporting(%q) loads virtio-balloon: %v, want %v", tc.tee, loaded, tc.load)
		}
	}
}
