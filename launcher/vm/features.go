package vm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// QEMUVersion is a QEMU release, e.g. 9.2.0.
type QEMUVersion struct{ Major, Minor, Micro int }

func (v QEMUVersion) String() string {
	if v.Micro == 0 {
		return fmt.Sprintf("%d.%d", v.Major, v.Minor)
	}
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)
}

// Less reports whether v is older than w.
func (v QEMUVersion) Less(w QEMUVersion) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Micro < w.Micro
}

var qemuVersionRE = regexp.MustCompile(`QEMU emulator version ([0-9]+)\.([0-9]+)(?:\.([0-9]+))?`)

// ParseQEMUVersion reads the version from `qemu-system-x86_64 -version`
// output ("QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)").
func ParseQEMUVersion(out string) (QEMUVersion, error) {
	m := qemuVersionRE.FindStringSubmatch(out)
	if m == nil {
		return QEMUVersion{}, fmt.Errorf("no \"QEMU emulator version\" in %q", firstLine(out))
	}
	var v QEMUVersion
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	if m[3] != "" {
		v.Micro, _ = strconv.Atoi(m[3])
	}
	return v, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// MinQEMU is the first QEMU release with each object type a TEE backend
// may need, for messages about a QEMU that lacks one.
var MinQEMU = map[string]QEMUVersion{
	"sev-snp-guest": {9, 1, 0},
	"igvm-cfg":      {10, 1, 0}, // the IGVM series was merged in July 2025
	"tdx-guest":     {10, 1, 0},
}

// QEMUFeatures is what one QEMU binary can do.
type QEMUFeatures struct {
	Path    string
	Version QEMUVersion
	// Objects are the user-creatable QOM types (-object help).
	Objects map[string]bool
}

// ProbeQEMU runs qemu -version and -object help.
func ProbeQEMU(ctx context.Context, qemu string) (*QEMUFeatures, error) {
	out, err := exec.CommandContext(ctx, qemu, "-version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("vm: %s -version: %v: %s", qemu, err, bytes.TrimSpace(out))
	}
	v, err := ParseQEMUVersion(string(out))
	if err != nil {
		return nil, fmt.Errorf("vm: %s is not QEMU: %w", qemu, err)
	}
	out, err = exec.CommandContext(ctx, qemu, "-machine", "none", "-object", "help").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("vm: listing QEMU object types with %s -object help: %v: %s", qemu, err, bytes.TrimSpace(out))
	}
	return &QEMUFeatures{Path: qemu, Version: v, Objects: parseObjectHelp(out)}, nil
}

func parseObjectHelp(out []byte) map[string]bool {
	known := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasSuffix(line, ":") {
			known[strings.Fields(line)[0]] = true
		}
	}
	return known
}

// Require returns an error naming every type in types this QEMU lacks,
// with the release that brought it, e.g. "QEMU 7.2 has no igvm-cfg; need
// ≥ 10.1".
func (f *QEMUFeatures) Require(types []string) error {
	var missing []string
	for _, t := range types {
		if f.Objects[t] {
			continue
		}
		msg := "no " + t
		if min, ok := MinQEMU[t]; ok {
			if f.Version.Less(min) {
				msg += fmt.Sprintf("; need ≥ %s", min)
			} else {
				msg += fmt.Sprintf(" although it is ≥ %s: it was built without that support", min)
			}
		}
		missing = append(missing, msg)
	}
	if len(missing) > 0 {
		return fmt.Errorf("QEMU %s (%s) has %s: set hypervisor.path to a QEMU that has it", f.Version, f.Path, strings.Join(missing, ", "))
	}
	return nil
}

// CheckQEMUFeatures checks that the QEMU binary knows the user-creatable
// object types a TEE backend needs (tee.Pieces.QOMTypes), so that a QEMU
// too old for SEV-SNP, TDX or IGVM fails with a clear message instead of a
// command-line error.
func CheckQEMUFeatures(ctx context.Context, qemu string, types []string) error {
	if len(types) == 0 {
		return nil
	}
	f, err := ProbeQEMU(ctx, qemu)
	if err != nil {
		return err
	}
	return f.Require(types)
}
