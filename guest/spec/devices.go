package spec

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/guest/api/initdata"
)

// Devices the host names. A device number is a capability: the host writes
// linux.devices (nodes the runtime creates in the container's /dev) and the
// device cgroup (which numbers the container may open, nodes it creates
// itself with CAP_MKNOD included), and in an snp or tdx pod the host is the
// adversary. The rule, for both:
//
//  1. The guest's own devices are never given, whatever the policy: block
//     devices (the dm-verity root, the containers' root disks), memory and
//     the kernel log (/dev/mem, /dev/kmem, /dev/port, /dev/kmsg), the misc
//     major (the TEE guest devices /dev/sev-guest and /dev/tdx_guest, the
//     TPM, vsock, device-mapper and loop control, KVM; misc minors are
//     dynamic, so all of misc but tun and fuse), virtio-serial ports (the
//     agent's channel, c8s.attest and c8s.kbs), consoles and serial lines
//     to the host, SCSI generic (raw commands to the disks), MSR and CPUID,
//     TPMs (reservedChar, reservedDrivers). A container holding one could
//     read the pod's secrets from memory or disk, or get evidence of the
//     pod's identity over report data of its choosing and so impersonate
//     the pod to a key broker. No workload needs them: naming a number
//     cannot pass a device of the host's into the VM.
//  2. The standard pseudo-devices every container has (null, zero, full,
//     random, urandom, tty, console, ptmx, ptys) are always allowed, at
//     their own paths (checkPath: /dev/urandom is always 1:9, and nodes
//     go below /dev only, never at the runtime's /dev/std*, console or
//     mounts).
//  3. A pod with measured init data gets only what agent_policy.
//     allow_devices lists; without init data (the default policy, which
//     also lets the host exec) every other device is created as asked.
//
// Numbers outside Linux's range are refused (mknod would alias them to
// others). An entry of linux.devices, or a device cgroup rule giving read
// or write access, that reaches a refused number fails the create with a
// ForbiddenError naming the device and the setting: a wildcard rule (all
// devices, as for a privileged container without
// privileged_without_host_devices) reaches the guest's own devices and is
// refused too. The rules start with "deny all", as containerd writes them,
// so nothing but the host's allow rules, checked here, and the runtime's
// own standard devices opens a device. (A privileged container, with
// CAP_SYS_ADMIN in the guest, can leave its device cgroup: a measured
// policy for privileged containers is a separate matter.)

// ForbiddenError is a part of the spec that the guest's rules or the pod's
// measured policy forbid the host to ask for.
type ForbiddenError struct{ msg string }

func (e *ForbiddenError) Error() string { return e.msg }

// DevicePolicy is what the pod's measured policy lets the host give its
// containers. The zero value is the default policy: every device but the
// guest's own.
type DevicePolicy struct {
	// Restricted limits devices to the standard ones and Allow.
	Restricted bool
	Allow      []initdata.DeviceRule
}

func (p DevicePolicy) allows(major, minor int64) bool {
	if !p.Restricted {
		return true
	}
	return slices.ContainsFunc(p.Allow, func(r initdata.DeviceRule) bool { return r.Matches(major, minor) })
}

func (p DevicePolicy) allowsMajor(major int64) bool {
	if !p.Restricted {
		return true
	}
	return slices.ContainsFunc(p.Allow, func(r initdata.DeviceRule) bool { return r.Major == major && r.Minor == initdata.AnyMinor })
}

// setting names the policy setting for messages.
func (p DevicePolicy) setting() string {
	quoted := make([]string, len(p.Allow))
	for i, r := range p.Allow {
		quoted[i] = strconv.Quote(r.String())
	}
	return "agent_policy.allow_devices = [" + strings.Join(quoted, ", ") + "]"
}

// reservedChar are the character majors the guest keeps for itself
// (numbers fixed by the kernel, Documentation/admin-guide/devices.txt),
// but for the minors in exemptMinors.
var reservedChar = map[int64]string{
	1:   "memory or kernel log device (/dev/mem, /dev/kmem, /dev/port, /dev/kmsg): guest memory holds the pod's secrets and keys",
	4:   "virtual terminal or serial line (/dev/tty0, /dev/ttyS*): the VM's consoles, lines to the host",
	7:   "virtual console memory (/dev/vcs*)",
	10:  "misc device (TEE guest devices such as /dev/sev-guest and /dev/tdx_guest, the TPM, vsock, device-mapper and loop control, KVM)",
	21:  "SCSI generic device (/dev/sg*): raw commands to the pod VM's disks",
	202: "model-specific register device (/dev/cpu/*/msr)",
	203: "CPUID device (/dev/cpu/*/cpuid)",
	229: "hypervisor console (/dev/hvc*): a line to the host",
}

// exemptMinors are harmless devices of reserved majors: null, zero, full,
// random, urandom; tun and fuse.
var exemptMinors = map[int64][]int64{1: {3, 5, 7, 8, 9}, 10: {200, 229}}

// reservedDrivers are the guest's drivers with dynamic majors, found by
// name in /proc/devices (DriverMajors), whose devices it keeps.
var reservedDrivers = map[string]string{
	"virtio-portsdev": "virtio-serial port (/dev/vport*): the agent's channel to the host, the c8s.attest and c8s.kbs ports",
	"tpm":             "TPM (/dev/tpm*)",
	"tpmrm":           "TPM (/dev/tpmrm*)",
	"bsg":             "SCSI generic device (/dev/bsg/*): raw commands to the pod VM's disks",
	"nvme-generic":    "NVMe generic device (/dev/ng*): raw commands to a disk",
	"nvme":            "NVMe controller (/dev/nvme*): raw admin commands to a disk",
	"vfio":            "VFIO device",
	"vfio-dev":        "VFIO device (/dev/vfio/devices/*)",
	"uio":             "userspace I/O device (/dev/uio*): a device's registers and memory",
}

// standardMinors are the standard pseudo-devices (containerd's default
// device cgroup): null, zero, full, random, urandom; tty, console, ptmx.
// In the guest /dev/console (5:1) is the VM's console, a line to the host;
// containerd's default rules (ctr run) allow it, and a container can write
// to the host through its stdout anyway.
var standardMinors = map[int64][]int64{1: {3, 5, 7, 8, 9}, 5: {0, 1, 2}}

// standardMajor reports whether every minor of a char major is standard:
// the pty slaves (/dev/pts/*, majors 136-143).
func standardMajor(major int64) bool { return major >= 136 && major <= 143 }

func standard(major, minor int64) bool {
	return standardMajor(major) || slices.Contains(standardMinors[major], minor)
}

// DriverMajors reads the character majors of the guest's drivers from a
// /proc/devices file, by driver name.
func DriverMajors(path string) (map[string]int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "Block devices:" {
			break
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			out[f[1]] = n
		}
	}
	return out, nil
}

// devices checks the host's devices against the guest's rules and the
// policy.
type devices struct {
	policy  DevicePolicy
	drivers map[string]int64 // dynamic majors by driver name
}

// reservedMajor says why every minor of a char major is the guest's, or "".
func (d devices) reservedMajor(major int64) string {
	if why, ok := reservedChar[major]; ok && len(exemptMinors[major]) == 0 {
		return why
	}
	for name, m := range d.drivers {
		if m == major {
			if why, ok := reservedDrivers[name]; ok {
				return why
			}
		}
	}
	return ""
}

// reserved says why a device is the guest's own, or "".
func (d devices) reserved(typ string, major, minor int64) string {
	if typ == "b" {
		return "block device: the pod VM's disks (its verified root, the containers' root disks)"
	}
	if why, ok := reservedChar[major]; ok && !slices.Contains(exemptMinors[major], minor) {
		return why
	}
	return d.reservedMajor(major)
}

// checkNumber checks that what, naming device typ major:minor, may be
// given to a container.
func (d devices) checkNumber(what, typ string, major, minor int64) error {
	name := fmt.Sprintf("%s (%s %d:%d)", what, typ, major, minor)
	if err := checkRange(name, major, minor); err != nil {
		return err
	}
	if why := d.reserved(typ, major, minor); why != "" {
		return &ForbiddenError{fmt.Sprintf("%s is refused: it is the pod VM's own %s, never given to a container whatever the pod's measured policy (agent_policy.allow_devices) says", name, why)}
	}
	if !standard(major, minor) && !d.policy.allows(major, minor) {
		return &ForbiddenError{fmt.Sprintf("%s is refused: the pod's measured policy does not allow it (%s; the pod's init data must list %q)", name, d.policy.setting(), fmt.Sprintf("c %d:%d", major, minor))}
	}
	return nil
}

// canonical are the paths of the standard devices an application trusts
// by name, and the numbers they must have: /dev/urandom that is /dev/zero
// hands out predictable keys.
var canonical = map[string][2]int64{
	"/dev/null": {1, 3}, "/dev/zero": {1, 5}, "/dev/full": {1, 7},
	"/dev/random": {1, 8}, "/dev/urandom": {1, 9}, "/dev/tty": {5, 0}, "/dev/ptmx": {5, 2},
}

// runtimePaths are the runtime's own names in a container's /dev: the
// console it binds for a terminal, the /proc/self/fd links a program
// reads and writes as its stdio, the devpts, shm and mqueue mounts. A
// node there would take the place of the container's stdio (stdin the
// host types, stderr to the VM's serial console: logs the policy keeps
// in the guest), or of a mount.
var runtimePaths = []string{
	"/dev/console", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/fd", "/dev/core",
	"/dev/pts", "/dev/shm", "/dev/mqueue", "/dev/termination-log",
}

// checkPath checks where linux.devices puts a node. It must be a clean
// path below /dev: a node anywhere else takes the place of a file of the
// image the policy pinned (a configuration read as empty from /dev/null).
// The runtime's own names are never given; a canonical path holds its
// own device only; and under a measured policy a standard device at any
// other path is a device the policy must list, as the application may
// trust it by that name (/dev/hwrng that is /dev/zero).
func (d devices) checkPath(dev specs.LinuxDevice) error {
	name := fmt.Sprintf("device %s (%s %d:%d)", dev.Path, dev.Type, dev.Major, dev.Minor)
	if dev.Type == "p" {
		name = fmt.Sprintf("FIFO %s", dev.Path)
	}
	if !strings.HasPrefix(dev.Path, "/dev/") || path.Clean(dev.Path) != dev.Path {
		return &ForbiddenError{fmt.Sprintf("%s is refused: a device node must be at a clean path below /dev/; elsewhere it would replace a file of the container's image", name)}
	}
	for _, p := range runtimePaths {
		if dev.Path == p || strings.HasPrefix(dev.Path, p+"/") {
			return &ForbiddenError{fmt.Sprintf("%s is refused: %s is the OCI runtime's own (the container's console, stdio, or a mount of its /dev), never a device of the host's choosing", name, p)}
		}
	}
	if want, ok := canonical[dev.Path]; ok && dev.Type == "p" {
		return &ForbiddenError{fmt.Sprintf("%s is refused: %s is always c %d:%d, the device every program expects there", name, dev.Path, want[0], want[1])}
	}
	return nil
}

// checkName checks the number of a char device (typ "c") at its path,
// once checkNumber has passed it (checkPath).
func (d devices) checkName(dev specs.LinuxDevice, typ string) error {
	name := fmt.Sprintf("device %s (%s %d:%d)", dev.Path, dev.Type, dev.Major, dev.Minor)
	want, isCanonical := canonical[dev.Path]
	if isCanonical && (typ != "c" || dev.Major != want[0] || dev.Minor != want[1]) {
		return &ForbiddenError{fmt.Sprintf("%s is refused: %s is always c %d:%d, the device every program expects there", name, dev.Path, want[0], want[1])}
	}
	if !isCanonical && typ == "c" && standard(dev.Major, dev.Minor) && !d.policy.allows(dev.Major, dev.Minor) {
		return &ForbiddenError{fmt.Sprintf("%s is refused: a standard device under another name than its own is a device the pod's measured policy must allow (%s; the pod's init data must list %q)", name, d.policy.setting(), fmt.Sprintf("c %d:%d", dev.Major, dev.Minor))}
	}
	return nil
}

// maxMajor and maxMinor bound Linux device numbers (12 and 20 bits).
const (
	maxMajor = 1<<12 - 1
	maxMinor = 1<<20 - 1
)

// checkRange refuses numbers outside Linux's: mknod(2) takes a 32-bit
// number, so the runtime's makedev of a larger major would lose its high
// bits and name another device (major 4106 is major 10, misc).
func checkRange(name string, major, minor int64) error {
	if major < 0 || major > maxMajor || minor < 0 || minor > maxMinor {
		return &ForbiddenError{fmt.Sprintf("%s is refused: not a Linux device number (major 0-%d, minor 0-%d): it would alias another device", name, maxMajor, maxMinor)}
	}
	return nil
}

// wildcard is the value of a nil or -1 major or minor of a cgroup rule.
func wildcard(v *int64) bool { return v == nil || *v < 0 }

func ruleString(r specs.LinuxDeviceCgroup) string {
	num := func(v *int64) string {
		if wildcard(v) {
			return "*"
		}
		return strconv.FormatInt(*v, 10)
	}
	typ := r.Type
	if typ == "" {
		typ = "a"
	}
	verb := "deny"
	if r.Allow {
		verb = "allow"
	}
	return fmt.Sprintf("%s %s %s:%s %s", verb, typ, num(r.Major), num(r.Minor), access(r))
}

func access(r specs.LinuxDeviceCgroup) string {
	if r.Access == "" {
		return "rwm"
	}
	return r.Access
}

// checkRule checks one device cgroup rule. Rules that deny, or allow only
// mknod ("m": a node nobody may open), need no check.
func (d devices) checkRule(r specs.LinuxDeviceCgroup) error {
	if !r.Allow || !strings.ContainsAny(access(r), "rw") {
		return nil
	}
	rule := fmt.Sprintf("device cgroup rule %q", ruleString(r))
	never := func(what string) error {
		return &ForbiddenError{fmt.Sprintf("%s is refused: it gives access to %s, the pod VM's own devices, never given to a container whatever the pod's measured policy (agent_policy.allow_devices) says", rule, what)}
	}
	switch {
	case r.Type == "" || r.Type == "a":
		return never("every device (as for a privileged container: run those with privileged_without_host_devices = true, as the packaged containerd drop-in does)")
	case r.Type == "b":
		return never("block devices")
	case r.Type != "c":
		return fmt.Errorf("%s: the type must be a, c or b", rule)
	case wildcard(r.Major):
		return never("every character device")
	case !wildcard(r.Minor):
		return d.checkNumber(rule, "c", *r.Major, *r.Minor)
	}
	if err := checkRange(rule, *r.Major, 0); err != nil {
		return err
	}
	if _, ok := reservedChar[*r.Major]; ok {
		return never(fmt.Sprintf("every device of major %d (%s)", *r.Major, reservedChar[*r.Major]))
	}
	if why := d.reservedMajor(*r.Major); why != "" {
		return never(fmt.Sprintf("every device of major %d (%s)", *r.Major, why))
	}
	if !standardMajor(*r.Major) && !d.policy.allowsMajor(*r.Major) {
		return &ForbiddenError{fmt.Sprintf("%s is refused: the pod's measured policy does not allow every device of major %d (%s; the pod's init data must list %q)", rule, *r.Major, d.policy.setting(), fmt.Sprintf("c %d:*", *r.Major))}
	}
	return nil
}

// denyAll is the device cgroup rule that containerd writes first.
var denyAll = specs.LinuxDeviceCgroup{Allow: false, Access: "rwm"}

// adaptDeviceAccess checks the spec's devices and device cgroup rules, and
// makes the rules start from "deny all".
func adaptDeviceAccess(l *specs.Linux, o Options) error {
	d := devices{policy: o.Devices, drivers: o.DriverMajors}
	for _, dev := range l.Devices {
		if err := d.checkPath(dev); err != nil {
			return err
		}
		typ := dev.Type
		switch typ {
		case "p":
			continue // a FIFO: no device number
		case "u":
			typ = "c"
		case "c", "b":
		default:
			return fmt.Errorf("device %s has type %q: want c, b, u or p", dev.Path, dev.Type)
		}
		if err := d.checkNumber("device "+dev.Path, typ, dev.Major, dev.Minor); err != nil {
			return err
		}
		if err := d.checkName(dev, typ); err != nil {
			return err
		}
		// crun ORs fileMode into mknod's mode: file-type bits there would
		// make the node another type than the one checked (0o60000 turns
		// a char device into a block device).
		if dev.FileMode != nil && *dev.FileMode&^os.FileMode(0o7777) != 0 {
			return &ForbiddenError{fmt.Sprintf("device %s has fileMode %#o: only permission bits (0o7777) may be set", dev.Path, uint32(*dev.FileMode))}
		}
	}
	if l.Resources == nil {
		l.Resources = &specs.LinuxResources{}
	}
	// cgroup v2 files the runtime would write for the host: controller
	// limits only. cgroup.procs, cgroup.threads or cgroup.kill would let
	// the host move the agent or another container's processes into this
	// cgroup, or kill them.
	for key := range l.Resources.Unified {
		if strings.HasPrefix(key, "cgroup.") || strings.ContainsAny(key, "/\x00") || key == "." || key == ".." {
			return &ForbiddenError{fmt.Sprintf("the cgroup file %q in linux.resources.unified is refused: only controller files (cpu.*, memory.*, io.*, pids.*, ...) may be set", key)}
		}
	}
	for _, r := range l.Resources.Devices {
		if err := d.checkRule(r); err != nil {
			return err
		}
	}
	if rules := l.Resources.Devices; len(rules) == 0 || rules[0].Allow || !(rules[0].Type == "" || rules[0].Type == "a") || access(rules[0]) != "rwm" {
		l.Resources.Devices = append([]specs.LinuxDeviceCgroup{denyAll}, rules...)
	}
	return nil
}
