package diag

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
	"github.com/c8s-dev/c8s/measurements/ovmf"
	"github.com/c8s-dev/c8s/measurements/tdx"
)

// qemuPath resolves hypervisor.path to a host path under the root, or "".
func (s *state) qemuPath() string {
	if s.qemuResolved {
		return s.qemu
	}
	s.qemuResolved = true
	p := s.o.Config.Hypervisor.Path
	switch {
	case p == "":
	case strings.Contains(p, "/"):
		if s.o.exists(p) {
			s.qemu = p
		}
	case s.o.live():
		if lp, err := exec.LookPath(p); err == nil {
			s.qemu = lp
		}
	default:
		for _, dir := range []string{"/usr/local/bin", "/usr/bin", "/bin"} {
			if s.o.exists(dir + "/" + p) {
				s.qemu = dir + "/" + p
				break
			}
		}
	}
	return s.qemu
}

// runQEMU runs the QEMU binary with args and returns its output.
func (s *state) runQEMU(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, s.o.path(s.qemu), args...).CombinedOutput()
	return string(out), err
}

// hasObject reports whether QEMU knows the QOM type t.
func (s *state) hasObject(ctx context.Context, t string) bool {
	if s.objects == nil {
		s.objects = map[string]bool{}
	}
	if v, ok := s.objects[t]; ok {
		return v
	}
	ok := vm.CheckQEMUFeatures(ctx, s.o.path(s.qemu), []string{t}) == nil
	s.objects[t] = ok
	return ok
}

// QEMUVersion extracts the version from `qemu-system-x86_64 -version`
// output, "" when there is none.
func QEMUVersion(out string) string {
	v, err := vm.ParseQEMUVersion(out)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)
}

func checkQEMU(ctx context.Context, s *state) Result {
	p := s.o.Config.Hypervisor.Path
	if s.qemuPath() == "" {
		return Result{Status: Fail, Detail: fmt.Sprintf("hypervisor.path %q not found", p),
			Hint: "install qemu-system-x86 (apt-get install qemu-system-x86) or set hypervisor.path"}
	}
	out, err := s.runQEMU(ctx, "-version")
	if err != nil {
		return Result{Status: Fail, Detail: fmt.Sprintf("%s -version failed: %v", s.qemu, err),
			Hint: "reinstall qemu-system-x86 or point hypervisor.path at a working QEMU"}
	}
	v := QEMUVersion(out)
	if v == "" {
		return Result{Status: Fail, Detail: fmt.Sprintf("%s -version printed no QEMU version", s.qemu),
			Hint: "point hypervisor.path at qemu-system-x86_64"}
	}
	s.qemuHelp, _ = s.runQEMU(ctx, "-help")
	return Result{Status: Pass, Detail: fmt.Sprintf("%s, version %s", s.qemu, v),
		Facts: map[string]string{"path": s.qemu, "version": v}}
}

// teeTypes returns the QOM types backend name needs.
func teeTypes(h config.Hypervisor, name string) []string {
	if b, err := tee.Lookup(name); err == nil {
		h.TEE = name
		if h.Firmware == "" {
			h.Firmware = DefaultFirmware
		}
		if p, err := b.QEMU(h); err == nil && len(p.QOMTypes) > 0 {
			return p.QOMTypes
		}
	}
	return map[string][]string{"snp": {"sev-snp-guest"}, "tdx": {"tdx-guest"}}[name]
}

func checkQEMUObjects(ctx context.Context, s *state, types []string, sev Status, hint string) Result {
	if s.qemuPath() == "" || s.qemuHelp == "" {
		return Result{Status: sev, Detail: "not checked: QEMU does not run", Hint: "see qemu.binary"}
	}
	var have, missing []string
	facts := map[string]string{}
	for _, t := range types {
		ok := s.hasObject(ctx, t)
		facts[t] = strconv.FormatBool(ok)
		if ok {
			have = append(have, t)
		} else {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return Result{Status: Pass, Detail: "QEMU has " + strings.Join(have, ", "), Facts: facts}
	}
	return Result{Status: sev, Detail: "QEMU lacks " + strings.Join(missing, ", "), Hint: hint, Facts: facts}
}

func checkQEMUSNP(ctx context.Context, s *state) Result {
	return checkQEMUObjects(ctx, s, teeTypes(s.o.Config.Hypervisor, "snp"), s.o.severity("snp"),
		"SEV-SNP needs QEMU 9.1 or newer (set hypervisor.path to it)")
}

func checkQEMUTDX(ctx context.Context, s *state) Result {
	return checkQEMUObjects(ctx, s, teeTypes(s.o.Config.Hypervisor, "tdx"), s.o.severity("tdx"),
		"TDX needs QEMU 10.1 or newer (set hypervisor.path to it)")
}

func checkQEMUIGVM(ctx context.Context, s *state) Result {
	return checkQEMUObjects(ctx, s, []string{"igvm-cfg"}, Warn,
		"IGVM launch (SVSM, precomputed measurements) needs QEMU 10.1+ built with IGVM support (igvm-cfg)")
}

func checkQEMUMigration(_ context.Context, s *state) Result {
	if s.qemuPath() == "" || s.qemuHelp == "" {
		return Result{Status: Warn, Detail: "not checked: QEMU does not run", Hint: "see qemu.binary"}
	}
	if strings.Contains(s.qemuHelp, "-incoming") {
		return Result{Status: Pass, Detail: "QEMU accepts -incoming"}
	}
	return Result{Status: Warn, Detail: "QEMU -help does not list -incoming: pod VMs cannot be migrated",
		Hint: "use a QEMU built with migration support"}
}

// firmwarePath returns the firmware a pod VM of the checked TEE boots
// (the backend's choice: hypervisor.firmware, or SeaBIOS for sim) and
// whether the configuration names it; an error when the backend has none.
func (o *Options) firmwarePath() (string, bool, error) {
	h := o.Config.Hypervisor
	h.TEE = o.TEE
	b, err := tee.Lookup(o.TEE)
	if err != nil {
		return "", false, err
	}
	p, err := b.QEMU(h)
	if err != nil {
		return "", false, err
	}
	return p.Firmware, h.Firmware != "", nil
}

func checkFirmware(_ context.Context, s *state) Result {
	o := s.o
	p, configured, err := o.firmwarePath()
	if err != nil || p == "" {
		detail := fmt.Sprintf("tee=%s has no firmware", o.TEE)
		if err != nil {
			detail = err.Error()
		}
		return Result{Status: Fail, Detail: detail,
			Hint: "install ovmf (apt-get install ovmf) and set hypervisor.firmware to an OVMF/TDVF build (" + DefaultFirmware + ")"}
	}
	data, err := o.readFile(p)
	if err != nil {
		hint := "install ovmf (apt-get install ovmf) or set hypervisor.firmware to an OVMF/TDVF build"
		if !configured {
			hint = "install seabios (apt-get install seabios) or set hypervisor.firmware"
		}
		return Result{Status: Fail, Detail: fmt.Sprintf("%s is missing: tee=%s pod VMs boot it", p, o.TEE), Hint: hint}
	}
	sum := sha256.Sum256(data)
	facts := map[string]string{"path": p, "size": strconv.Itoa(len(data)), "sha256": hex.EncodeToString(sum[:])}
	var parts, lacks []string
	if fw, err := ovmf.Parse(data); err == nil && fw.Metadata != nil {
		facts["sev_metadata_version"] = strconv.FormatUint(uint64(fw.Metadata.Version), 10)
		facts["sev_metadata_sections"] = strconv.Itoa(len(fw.Metadata.Sections))
		parts = append(parts, fmt.Sprintf("SEV metadata v%d with %d sections", fw.Metadata.Version, len(fw.Metadata.Sections)))
	} else {
		lacks = append(lacks, "snp")
		parts = append(parts, "no SEV metadata")
	}
	if md, err := tdx.Parse(data); err == nil {
		facts["tdx_metadata_version"] = strconv.FormatUint(uint64(md.Version), 10)
		facts["tdx_metadata_sections"] = strconv.Itoa(len(md.Sections))
		parts = append(parts, fmt.Sprintf("TDVF metadata v%d with %d sections", md.Version, len(md.Sections)))
	} else {
		lacks = append(lacks, "tdx")
		parts = append(parts, "no TDVF metadata")
	}
	detail := fmt.Sprintf("%s (%d bytes): %s", p, len(data), strings.Join(parts, ", "))
	for _, t := range lacks {
		if o.TEE == t {
			return Result{Status: Fail, Detail: detail, Facts: facts,
				Hint: fmt.Sprintf("tee=%s needs firmware with %s metadata: set hypervisor.firmware to an OVMF build with %s support", t, map[string]string{"snp": "SEV", "tdx": "TDVF"}[t], strings.ToUpper(t))}
		}
	}
	return Result{Status: Pass, Detail: detail, Facts: facts}
}
