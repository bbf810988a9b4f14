package initdata

import (
	"fmt"
	"strconv"
	"strings"
)

// DeviceRule is one entry of agent_policy.allow_devices: a character
// device number the host may have created in, and opened by, the pod's
// containers, written as the device cgroup writes it: "c MAJOR:MINOR", or
// "c MAJOR:*" for every minor of a major. Block devices are never allowed
// (the pod VM's disks: its verified root, the containers' root disks), nor
// are the guest's own devices, whatever the policy lists (guest/spec).
type DeviceRule struct {
	Major int64
	// Minor is AnyMinor for every minor of Major.
	Minor int64
}

// AnyMinor is the Minor of a rule that matches every minor.
const AnyMinor = -1

// ParseDeviceRule reads one allow_devices entry.
func ParseDeviceRule(s string) (DeviceRule, error) {
	bad := func(why string) (DeviceRule, error) {
		return DeviceRule{}, fmt.Errorf("agent_policy.allow_devices entry %q: %s (write \"c MAJOR:MINOR\" or \"c MAJOR:*\", for example \"c 10:200\")", s, why)
	}
	f := strings.Fields(s)
	if len(f) != 2 {
		return bad("not a device type and number")
	}
	switch f[0] {
	case "c":
	case "b":
		return bad("block devices are the pod VM's disks (its verified root, the containers' root disks) and are never given to a container")
	default:
		return bad("the type must be c (a character device)")
	}
	maj, min, ok := strings.Cut(f[1], ":")
	if !ok {
		return bad("no MAJOR:MINOR")
	}
	r := DeviceRule{Minor: AnyMinor}
	var err error
	if r.Major, err = strconv.ParseInt(maj, 10, 64); err != nil || r.Major < 0 || r.Major > 4095 {
		return bad("the major must be a number from 0 to 4095")
	}
	if min != "*" {
		if r.Minor, err = strconv.ParseInt(min, 10, 64); err != nil || r.Minor < 0 || r.Minor > 1<<20-1 {
			return bad("the minor must be a number from 0 to 1048575, or *")
		}
	}
	return r, nil
}

// Matches reports whether the rule allows character device major:minor.
func (r DeviceRule) Matches(major, minor int64) bool {
	return r.Major == major && (r.Minor == AnyMinor || r.Minor == minor)
}

// String is the rule as allow_devices writes it.
func (r DeviceRule) String() string {
	if r.Minor == AnyMinor {
		return fmt.Sprintf("c %d:*", r.Major)
	}
	return fmt.Sprintf("c %d:%d", r.Major, r.Minor)
}

// DevicesRestricted reports whether the host may give the pod's containers
// only the standard devices (/dev/null, /dev/zero, ..., ptys) and those
// AllowDevices lists: true for any init data (Parse sets it), false for the
// default policy of a pod without init data, under which every device but
// the guest's own may be given.
func (p AgentPolicy) DevicesRestricted() bool { return p.restrictDevices }

// DeviceRules returns AllowDevices parsed (Parse has checked every entry).
func (p AgentPolicy) DeviceRules() []DeviceRule {
	var rules []DeviceRule
	for _, s := range p.AllowDevices {
		if r, err := ParseDeviceRule(s); err == nil {
			rules = append(rules, r)
		}
	}
	return rules
}

// checkDevices validates AllowDevices.
func (p AgentPolicy) checkDevices() error {
	for _, s := range p.AllowDevices {
		if _, err := ParseDeviceRule(s); err != nil {
			return err
		}
	}
	return nil
}
