package attest

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
)

// fakeHardware is a Hardware that reports tee (and sign), or err.
type fakeHardware struct {
	tee, sign string
	err       error
}

func (f fakeHardware) TEE() (string, string, error) { return f.tee, f.sign, f.err }

// cpuinfo is a /proc/cpuinfo of n CPUs with the flags of a TCG guest
// (QEMU's qemu64 model) and extra on the last CPU.
func cpuinfo(n int, extra string) string {
	var b strings.Builder
	for i := range n {
		flags := "fpu de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx lm rep_good nopl xtopology cpuid tsc_known_freq pni cx16 x2apic hypervisor lahf_lm svm"
		if i == n-1 && extra != "" {
			flags += " " + extra
		}
		fmt.Fprintf(&b, "processor\t: %d\nvendor_id\t: AuthenticAMD\nmodel name\t: QEMU Virtual CPU version 2.5+\nflags\t\t: %s\nbugs\t\t: fxsave_leak sysret_ss_attrs\n\n", i, flags)
	}
	return b.String()
}

// The guest's kernel shows SEV-SNP by the sysfs directory it creates in an
// SNP guest only, TDX by the tdx_guest CPU flag; a sim (TCG) guest has
// neither. Lookalikes do not count: the flags of the SEV host feature
// (sev_snp), a flag of that name elsewhere than the flags line.
func TestKernelHardware(t *testing.T) {
	for _, tc := range []struct {
		name  string
		paths []string
		want  string
		sign  []string
		err   string
	}{
		{"sim (TCG)", []string{"proc/cpuinfo=" + cpuinfo(2, "")}, "", []string{SNPSysfsDir, TDXGuestFlag, CPUInfo}, ""},
		{"SEV-SNP", []string{"proc/cpuinfo=" + cpuinfo(1, "sev sev_es sev_snp"), SNPSysfsDir + "/vmpl=0\n"}, teeparam.SNP, []string{SNPSysfsDir}, ""},
		{"TDX", []string{"proc/cpuinfo=" + cpuinfo(2, "tdx_guest")}, teeparam.TDX, []string{CPUInfo, TDXGuestFlag}, ""},
		// The CPUID feature of an SNP-capable CPU is no SNP guest: the
		// kernel creates the directory from the SEV_STATUS MSR.
		{"sev_snp flag without the directory", []string{"proc/cpuinfo=" + cpuinfo(1, "sev sev_es sev_snp")}, "", nil, ""},
		{"tdx_guest outside the flags", []string{"proc/cpuinfo=" + strings.Replace(cpuinfo(1, ""), "QEMU Virtual CPU", "tdx_guest", 1)}, "", nil, ""},
		{"both", []string{"proc/cpuinfo=" + cpuinfo(1, "tdx_guest"), SNPSysfsDir + "/"}, "", nil, "both SEV-SNP"},
		{"no cpuinfo", []string{SNPSysfsDir + "/"}, "", nil, "read the CPU flags"},
		{"cpuinfo without flags", []string{"proc/cpuinfo=processor\t: 0\n"}, "", nil, "lists no CPU flags"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			fixture(t, root, tc.paths...)
			tee, sign, err := KernelHardware{Root: root}.TEE()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("TEE() = %q, %v; want an error with %q", tee, err, tc.err)
				}
				return
			}
			if err != nil || tee != tc.want {
				t.Fatalf("TEE() = %q (%s), %v; want %q", tee, sign, err, tc.want)
			}
			for _, w := range tc.sign {
				if !strings.Contains(sign, w) {
					t.Errorf("sign %q does not name %s", sign, w)
				}
			}
		})
	}
}

// Every combination of the TEE the command line names and the hardware TEE
// the kernel runs in: only snp in SEV-SNP, tdx in TDX, and sim or no TEE
// outside both run. A guest in SNP or TDX hardware never runs as sim or as
// no TEE (the host's attack: the sim TEE's conveniences), nor as the other
// hardware TEE; one started as snp or tdx never runs without it; hardware
// that cannot be told fails closed.
func TestCheckHardware(t *testing.T) {
	hw := map[string]fakeHardware{
		"none":    {"", "no sign of either", nil},
		"snp":     {teeparam.SNP, "the SNP sign", nil},
		"tdx":     {teeparam.TDX, "the TDX sign", nil},
		"unknown": {"", "", errors.New("cannot read the flags")},
	}
	ok := map[[2]string]bool{
		{"", "none"}: true, {teeparam.Sim, "none"}: true,
		{teeparam.SNP, "snp"}: true, {teeparam.TDX, "tdx"}: true,
	}
	for _, tee := range []string{"", teeparam.Sim, teeparam.SNP, teeparam.TDX} {
		for _, name := range []string{"none", "snp", "tdx", "unknown"} {
			h := hw[name]
			err := CheckHardware(tee, h)
			if ok[[2]string{tee, name}] {
				if err != nil {
					t.Errorf("started as %q on %s hardware: %v; want it to run", tee, name, err)
				}
				continue
			}
			if !errors.Is(err, ErrHardwareMismatch) {
				t.Errorf("started as %q on %s hardware: %v; want ErrHardwareMismatch", tee, name, err)
				continue
			}
			// The console reason names what was asked and what was found.
			want := []string{}
			if tee == "" {
				want = append(want, "no TEE", teeparam.Key)
			} else {
				want = append(want, "started as "+tee, teeparam.Format(tee))
			}
			switch name {
			case "unknown":
				want = append(want, "cannot tell", "cannot read the flags")
			case "none":
				want = append(want, h.sign, hardwareName(tee))
			default:
				want = append(want, h.sign, hardwareName(h.tee), teeparam.Format(h.tee))
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("started as %q on %s hardware: %q does not name %q", tee, name, err, w)
				}
			}
		}
	}
	if err := CheckHardware("sgx", hw["none"]); err == nil || !strings.Contains(err.Error(), "sgx") {
		t.Errorf("CheckHardware(sgx) = %v, want an error naming it", err)
	}
}

// StartedAs reads the TEE from the command line and checks the hardware:
// what the rest of the guest decides on (virtio-rng, the balloon, the
// evidence provider, the policy of a VM launched without init data) is
// only ever a TEE the hardware agrees with.
func TestStartedAs(t *testing.T) {
	none, snp := fakeHardware{sign: "no SNP"}, fakeHardware{tee: teeparam.SNP, sign: "SNP"}
	for _, tc := range []struct {
		cmdline string
		hw      Hardware
		want    string
		err     error
		errText string
	}{
		{"console=ttyS0 c8s.tee=sim\n", none, teeparam.Sim, nil, ""},
		{"console=ttyS0 c8s.tee=snp\n", snp, teeparam.SNP, nil, ""},
		{"console=ttyS0\n", none, "", nil, ""},
		{"console=ttyS0 c8s.tee=sim\n", snp, "", ErrHardwareMismatch, "started as sim"},
		{"console=ttyS0\n", snp, "", ErrHardwareMismatch, "no TEE"},
		{"console=ttyS0 c8s.tee=snp\n", none, "", ErrHardwareMismatch, "started as snp"},
		// A command line that cannot be read as one TEE is not a
		// mismatch: the caller fails closed on it as before.
		{"c8s.tee=snp c8s.tee=sim\n", snp, "", nil, "more than once"},
		{"c8s.tee=none\n", none, "", nil, `unknown TEE "none"`},
	} {
		got, err := StartedAs(tc.cmdline, tc.hw)
		if tc.errText == "" {
			if err != nil || got != tc.want {
				t.Errorf("StartedAs(%q) = %q, %v; want %q", tc.cmdline, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.errText) || (tc.err != nil) != errors.Is(err, ErrHardwareMismatch) {
			t.Errorf("StartedAs(%q) = %q, %v; want an error with %q (ErrHardwareMismatch: %v)", tc.cmdline, got, err, tc.errText, tc.err != nil)
		}
	}
}

// The real Hardware on a fixture of an SNP guest started as sim: the check
// is wired to what the kernel shows, not only to fakes.
func TestStartedAsSimInSNPGuest(t *testing.T) {
	root := t.TempDir()
	fixture(t, root, "proc/cpuinfo="+cpuinfo(1, ""), SNPSysfsDir+"/vmpl=0\n")
	_, err := StartedAs("console=ttyS0 c8s.tee=sim", KernelHardware{Root: root})
	if !errors.Is(err, ErrHardwareMismatch) || !strings.Contains(err.Error(), filepath.Join(root, SNPSysfsDir)) {
		t.Fatalf("sim in an SNP guest: %v; want ErrHardwareMismatch naming %s", err, SNPSysfsDir)
	}
}
