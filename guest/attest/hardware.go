package attest

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
)

// ErrHardwareMismatch is StartedAs's error when the TEE the measured kernel
// command line names (c8s.tee) is not the hardware TEE the guest's kernel
// runs in, or when the guest cannot tell which that is. The guest then
// runs as no TEE at all: PID 1 powers the VM off with the reason on its
// console, which the shim reports.
var ErrHardwareMismatch = errors.New("this VM's hardware is not the TEE it was started as")

// Hardware tells which hardware TEE the guest runs in.
type Hardware interface {
	// TEE returns teeparam.SNP or teeparam.TDX, or "" for neither, and
	// the sign it went by (for "", what it looked at), for errors.
	TEE() (tee, sign string, err error)
}

// Where the guest's Linux kernel shows the hardware TEE it runs in.
const (
	// SNPSysfsDir is the directory Linux (6.11 and later,
	// arch/x86/coco/sev) creates, with its vmpl attribute, in an SEV-SNP
	// guest only: when cc_platform_has(CC_ATTR_GUEST_SEV_SNP), which the
	// kernel sets from the SNP-active bit of the SEV_STATUS MSR
	// (C001_0131h) it reads at boot.
	SNPSysfsDir = "sys/devices/system/cpu/sev"
	// CPUInfo is the kernel's CPU description, whose flags carry
	// TDXGuestFlag in a TDX guest.
	CPUInfo = "proc/cpuinfo"
	// TDXGuestFlag is X86_FEATURE_TDX_GUEST's name in CPUInfo: Linux
	// forces the feature at boot when CPUID leaf 21h carries the TDX
	// signature "IntelTDX    ", and then sets the TD up through TDCALLs
	// (it panics when they fail).
	TDXGuestFlag = "tdx_guest"
)

// KernelHardware is the Hardware of the guest below Root ("/" in the guest,
// a fixture in tests) as its Linux kernel found it at boot: SEV-SNP when
// SNPSysfsDir exists, TDX when CPUInfo's flags carry TDXGuestFlag.
//
// Neither can be taken away by the host from a guest that runs in that
// TEE, which is what matters here: a host that starts an SNP or TDX VM as
// sim (or as no TEE) to have the guest take the sim TEE's conveniences.
//
//   - SEV-SNP: the SEV_STATUS MSR is the hardware's (the VMSA's SEV
//     features, which the launch measures), and the guest reads it without
//     a #VC to the host (AMD64 APM vol. 2, "SEV_STATUS MSR"). A kernel that
//     missed SNP could not run anyway: it would address its encrypted,
//     validated memory as shared.
//   - TDX: in a TD the TDX module, not the host's VMM, answers CPUID leaf
//     21h; the host cannot configure it. A kernel that missed TDX could
//     not run anyway: it would take no #VE and address its private memory
//     as shared.
//
// The other way round, a host that emulates either in a VM that is neither
// (a TCG or patched hypervisor faking the MSR, the CPUID leaf and the
// TDCALLs or GHCB calls behind them) can make the guest believe it runs in
// SNP or TDX: that check is a clear early error, not a defence. Such a VM
// has no AMD- or Intel-signed evidence to show, and the relying party
// refuses it.
//
// A kernel before 6.11 (no SNPSysfsDir) would find no SEV-SNP: a VM started
// as snp would refuse to run, one started as sim on SNP hardware would not.
// The guest image pins a 6.12 kernel (images/build.sh).
type KernelHardware struct {
	Root string
}

// TEE implements Hardware.
func (h KernelHardware) TEE() (string, string, error) {
	snpDir := filepath.Join(h.Root, SNPSysfsDir)
	snp := true
	if _, err := os.Stat(snpDir); errors.Is(err, fs.ErrNotExist) {
		snp = false
	} else if err != nil {
		return "", "", fmt.Errorf("look for %s, which Linux creates in an SEV-SNP guest: %w", snpDir, err)
	}
	cpuinfo := filepath.Join(h.Root, CPUInfo)
	tdx, err := cpuFlag(cpuinfo, TDXGuestFlag)
	if err != nil {
		return "", "", err
	}
	snpSign := fmt.Sprintf("%s exists", snpDir)
	tdxSign := fmt.Sprintf("%s has the %s flag", cpuinfo, TDXGuestFlag)
	switch {
	case snp && tdx:
		return "", "", fmt.Errorf("the guest's kernel shows both SEV-SNP (%s) and TDX (%s)", snpSign, tdxSign)
	case snp:
		return teeparam.SNP, snpSign, nil
	case tdx:
		return teeparam.TDX, tdxSign, nil
	}
	return "", fmt.Sprintf("no %s, no %s flag in %s", snpDir, TDXGuestFlag, cpuinfo), nil
}

// cpuFlag reports whether the flags line of any CPU in the cpuinfo file at
// path lists flag. A file without a flags line is an error: it says nothing.
func cpuFlag(path, flag string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("read the CPU flags: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	found, has := false, false
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		found = true
		if slices.Contains(strings.Fields(v), flag) {
			has = true
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("read the CPU flags from %s: %w", path, err)
	}
	if !found {
		return false, fmt.Errorf("%s lists no CPU flags", path)
	}
	return has, nil
}

// StartedAs returns the TEE the guest was started as: the one its kernel
// command line (the contents of /proc/cmdline) names (c8s.tee,
// guest/api/teeparam), or "" for none, once hw agrees (CheckHardware).
// Every decision the guest takes on its TEE starts from here.
func StartedAs(cmdline string, hw Hardware) (string, error) {
	tee, _, err := teeparam.FromCmdline(cmdline)
	if err != nil {
		return "", err
	}
	if err := CheckHardware(tee, hw); err != nil {
		return "", err
	}
	return tee, nil
}

// CheckHardware fails with ErrHardwareMismatch unless the hardware TEE hw
// reports is the TEE tee, as the measured command line names it: SEV-SNP
// for snp, TDX for tdx, neither for sim and for "" (no c8s.tee). So a guest
// in SNP or TDX hardware never runs as sim or as no TEE, whose
// conveniences (the host's entropy, a free page reporting balloon,
// onlining the host's hot-plugged memory, the host-served attestation
// port, the allow-all policy) would hand the host what the TEE keeps from
// it; and a guest started as snp or tdx never runs without that hardware.
// A hw that cannot tell fails closed.
func CheckHardware(tee string, hw Hardware) error {
	if tee != "" && !teeparam.Known(tee) {
		return fmt.Errorf("%s=%s: unknown TEE; known TEEs are %s", teeparam.Key, tee, strings.Join(teeparam.Names, ", "))
	}
	got, sign, err := hw.TEE()
	if err != nil {
		return fmt.Errorf("%w: this VM was started as %s, but the guest cannot tell which hardware TEE it runs in, so it does not run at all: %w", ErrHardwareMismatch, startedAsText(tee), err)
	}
	want := tee
	if tee == teeparam.Sim {
		want = ""
	}
	if got == want {
		return nil
	}
	if got != "" {
		return fmt.Errorf("%w: this VM runs in %s (%s) but was started as %s: a guest in %s hardware runs only as %s (launch it with %s, as the launcher's hypervisor.tee = %q does), never as another TEE, the sim TEE or none",
			ErrHardwareMismatch, hardwareName(got), sign, startedAsText(tee), hardwareName(got), got, teeparam.Format(got), got)
	}
	return fmt.Errorf("%w: this VM was started as %s but does not run in %s (%s): check that the VM is launched as an %s guest on a host that has it enabled, or start it as sim",
		ErrHardwareMismatch, startedAsText(tee), hardwareName(tee), sign, hardwareName(tee))
}

// startedAsText says what the command line names: "snp (c8s.tee=snp on its
// measured kernel command line)", or "no TEE (no c8s.tee ...)".
func startedAsText(tee string) string {
	if tee == "" {
		return fmt.Sprintf("no TEE (no %s on its kernel command line)", teeparam.Key)
	}
	return fmt.Sprintf("%s (%s on its measured kernel command line)", tee, teeparam.Format(tee))
}

// hardwareName is the hardware TEE's name in messages.
func hardwareName(tee string) string {
	switch tee {
	case teeparam.SNP:
		return "AMD SEV-SNP"
	case teeparam.TDX:
		return "Intel TDX"
	}
	return tee
}
