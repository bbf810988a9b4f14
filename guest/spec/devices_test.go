package spec

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/guest/api/initdata"
)

// guestDrivers is a guest's /proc/devices as DriverMajors reads it.
var guestDrivers = map[string]int64{"virtio-portsdev": 251, "tpmrm": 252, "bsg": 248, "hidraw": 245}

func i64(v int64) *int64 { return &v }

// adaptDevices runs Adapt on a spec with the devices and cgroup rules
// given (containerd's "deny all" first, then rules) under policy.
func adaptDevices(t *testing.T, policy DevicePolicy, devs []specs.LinuxDevice, rules ...specs.LinuxDeviceCgroup) (*specs.Spec, error) {
	t.Helper()
	s := specs.Spec{
		Process: &specs.Process{Args: []string{"sh"}},
		Linux: &specs.Linux{
			Devices:   devs,
			Resources: &specs.LinuxResources{Devices: append([]specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}, rules...)},
		},
	}
	raw, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Adapt(raw, Options{ContainerID: "c1", Rootfs: "/r", Exists: guestHas(), Devices: policy, DriverMajors: guestDrivers})
	if err != nil {
		return nil, err
	}
	return plan.Spec, nil
}

func allow(typ string, major, minor int64) specs.LinuxDeviceCgroup {
	r := specs.LinuxDeviceCgroup{Allow: true, Type: typ, Access: "rwm"}
	if major >= 0 {
		r.Major = i64(major)
	}
	if minor >= 0 {
		r.Minor = i64(minor)
	}
	return r
}

// policyOf is the device policy of init data doc, as the agent builds it.
func policyOf(t *testing.T, doc string) DevicePolicy {
	t.Helper()
	d, err := initdata.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return DevicePolicy{Restricted: d.Agent.DevicesRestricted(), Allow: d.Agent.DeviceRules()}
}

// TestMaliciousHostDevices: a host that names the guest's own devices, by
// their own paths or disguised under harmless ones, is refused whatever
// the policy, with an error naming the device and the policy setting.
func TestMaliciousHostDevices(t *testing.T) {
	policies := map[string]DevicePolicy{
		"no init data": {},
		"init data allowing misc, mem and the ports": policyOf(t, "version = \"0.1\"\n[agent_policy]\nallow_devices = [\"c 10:*\", \"c 1:1\", \"c 251:*\", \"c 252:0\", \"c 10:124\"]\n"),
	}
	for _, tc := range []struct {
		name string
		dev  specs.LinuxDevice
		want string
	}{
		{"sev-guest", specs.LinuxDevice{Path: "/dev/sev-guest", Type: "c", Major: 10, Minor: 124}, "misc device"},
		{"tdx_guest", specs.LinuxDevice{Path: "/dev/tdx_guest", Type: "c", Major: 10, Minor: 123}, "TEE guest devices"},
		{"tpm0", specs.LinuxDevice{Path: "/dev/tpm0", Type: "c", Major: 10, Minor: 224}, "misc device"},
		{"tpmrm0", specs.LinuxDevice{Path: "/dev/tpmrm0", Type: "c", Major: 252, Minor: 0}, "TPM"},
		{"verity root", specs.LinuxDevice{Path: "/dev/vda", Type: "b", Major: 254, Minor: 0}, "block device"},
		{"other container's disk", specs.LinuxDevice{Path: "/dev/sdb", Type: "b", Major: 8, Minor: 16}, "block device"},
		{"mem disguised as null", specs.LinuxDevice{Path: "/dev/null", Type: "c", Major: 1, Minor: 1}, "memory"},
		{"kmsg", specs.LinuxDevice{Path: "/dev/kmsg", Type: "c", Major: 1, Minor: 11}, "kernel log"},
		{"agent channel", specs.LinuxDevice{Path: "/dev/vport1p1", Type: "c", Major: 251, Minor: 1}, "virtio-serial"},
		{"unbuffered type", specs.LinuxDevice{Path: "/dev/x", Type: "u", Major: 10, Minor: 124}, "misc device"},
		{"scsi generic", specs.LinuxDevice{Path: "/dev/sg0", Type: "c", Major: 21, Minor: 0}, "SCSI generic"},
		{"bsg", specs.LinuxDevice{Path: "/dev/bsg/0:0:0:0", Type: "c", Major: 248, Minor: 0}, "SCSI generic"},
		{"serial line", specs.LinuxDevice{Path: "/dev/ttyS0", Type: "c", Major: 4, Minor: 64}, "serial line"},
	} {
		for pname, p := range policies {
			t.Run(tc.name+"/"+pname, func(t *testing.T) {
				_, err := adaptDevices(t, p, []specs.LinuxDevice{tc.dev})
				var fe *ForbiddenError
				if !errors.As(err, &fe) {
					t.Fatalf("device %+v: err = %v, want a ForbiddenError", tc.dev, err)
				}
				for _, want := range []string{tc.dev.Path, "agent_policy.allow_devices", "never given", tc.want} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not name %q", err, want)
					}
				}
				// The same number through the device cgroup alone.
				typ := tc.dev.Type
				if typ == "u" {
					typ = "c"
				}
				if _, err := adaptDevices(t, p, nil, allow(typ, tc.dev.Major, tc.dev.Minor)); !errors.As(err, &fe) {
					t.Errorf("cgroup rule for %+v: err = %v, want a ForbiddenError", tc.dev, err)
				}
			})
		}
	}
}

// TestMaliciousHostDeviceRules: cgroup rules that reach the guest's own
// devices by wildcard are refused; mknod-only and deny rules are not
// access and pass.
func TestMaliciousHostDeviceRules(t *testing.T) {
	for _, tc := range []struct {
		rule specs.LinuxDeviceCgroup
		want string
	}{
		{specs.LinuxDeviceCgroup{Allow: true, Access: "rwm"}, "every device"},
		{allow("a", -1, -1), "privileged_without_host_devices"},
		{allow("c", -1, -1), "every character device"},
		{allow("b", -1, -1), "block devices"},
		{allow("b", 8, -1), "block devices"},
		{allow("c", 10, -1), "major 10"},
		{allow("c", 1, -1), "major 1"},
		{allow("c", 251, -1), "virtio-serial"},
		{specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: i64(1), Minor: i64(1), Access: "r"}, "memory"},
	} {
		_, err := adaptDevices(t, DevicePolicy{}, nil, tc.rule)
		var fe *ForbiddenError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "agent_policy.allow_devices") {
			t.Errorf("rule %s: err = %v, want a ForbiddenError naming %q and the policy", ruleString(tc.rule), err, tc.want)
		}
	}
	for _, r := range []specs.LinuxDeviceCgroup{
		{Allow: true, Type: "c", Access: "m"},
		{Allow: true, Type: "b", Access: "m"},
		{Allow: false, Type: "c", Major: i64(10), Access: "rwm"},
	} {
		if _, err := adaptDevices(t, DevicePolicy{}, nil, r); err != nil {
			t.Errorf("rule %s: %v", ruleString(r), err)
		}
	}
}

// TestDeviceNumberAliases: mknod(2) takes 32 bits, so a major above 4095
// loses its high bits and names another device: 4106:124 is misc 10:124.
func TestDeviceNumberAliases(t *testing.T) {
	for _, dev := range []specs.LinuxDevice{
		{Path: "/dev/x", Type: "c", Major: 4096 + 10, Minor: 124},
		{Path: "/dev/x", Type: "c", Major: 1 << 32, Minor: 3},
		{Path: "/dev/x", Type: "c", Major: 195, Minor: 1 << 20},
		{Path: "/dev/x", Type: "c", Major: -1, Minor: 0},
	} {
		_, err := adaptDevices(t, DevicePolicy{}, []specs.LinuxDevice{dev})
		var fe *ForbiddenError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "not a Linux device number") {
			t.Errorf("device %d:%d: err = %v, want a refusal", dev.Major, dev.Minor, err)
		}
	}
	for _, r := range []specs.LinuxDeviceCgroup{allow("c", 4096+10, -1), allow("c", 4096+10, 124)} {
		_, err := adaptDevices(t, DevicePolicy{}, nil, r)
		var fe *ForbiddenError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "alias") {
			t.Errorf("rule %s: err = %v, want a refusal", ruleString(r), err)
		}
	}
}

// TestDevicesWithoutInitData: every device but the guest's own is created
// as asked, and the rules start from "deny all" even if the host's do not.
func TestDevicesWithoutInitData(t *testing.T) {
	devs := []specs.LinuxDevice{
		{Path: "/dev/c8s-nri-test", Type: "c", Major: 1, Minor: 3},
		{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229},
		{Path: "/dev/net/tun", Type: "c", Major: 10, Minor: 200},
		{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
		{Path: "/dev/hidraw0", Type: "c", Major: 245, Minor: 0},
		{Path: "/dev/fifo", Type: "p"},
	}
	s, err := adaptDevices(t, DevicePolicy{}, devs, allow("c", 1, 3), allow("c", 195, -1), allow("c", 136, -1))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Devices) != len(devs) {
		t.Errorf("devices = %+v, want all %d kept", s.Linux.Devices, len(devs))
	}
	if got := s.Linux.Resources.Devices; len(got) != 4 || got[0].Allow {
		t.Errorf("rules = %+v, want the host's 4 as they were", got)
	}

	// A spec without "deny all" first gets it.
	raw, _ := json.Marshal(&specs.Spec{Process: &specs.Process{Args: []string{"sh"}}, Linux: &specs.Linux{
		Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{allow("c", 1, 3)}},
	}})
	plan, err := Adapt(raw, Options{ContainerID: "c1", Exists: guestHas(), DriverMajors: guestDrivers})
	if err != nil {
		t.Fatal(err)
	}
	if got := plan.Spec.Linux.Resources.Devices; len(got) != 2 || got[0].Allow || got[0].Type != "" || got[0].Access != "rwm" {
		t.Errorf("rules = %+v, want deny all, then the host's", got)
	}
}

// TestDevicesUnderMeasuredPolicy: with init data, only the standard devices
// and those allow_devices lists; the error names the device, the setting
// and what to add.
func TestDevicesUnderMeasuredPolicy(t *testing.T) {
	p := policyOf(t, "version = \"0.1\"\n[agent_policy]\nallow_devices = [\"c 195:0\", \"c 13:*\"]\n")
	ok := []specs.LinuxDevice{
		{Path: "/dev/null", Type: "c", Major: 1, Minor: 3},
		{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
		{Path: "/dev/input/event3", Type: "c", Major: 13, Minor: 67},
	}
	if _, err := adaptDevices(t, p, ok, allow("c", 1, 3), allow("c", 195, 0), allow("c", 13, -1), allow("c", 136, -1), allow("c", 5, 2)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		devs  []specs.LinuxDevice
		rules []specs.LinuxDeviceCgroup
		want  []string
	}{
		{[]specs.LinuxDevice{{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1}}, nil,
			[]string{"/dev/nvidia1", "c 195:1", `agent_policy.allow_devices = ["c 195:0", "c 13:*"]`, `must list "c 195:1"`}},
		{[]specs.LinuxDevice{{Path: "/dev/net/tun", Type: "c", Major: 10, Minor: 200}}, nil,
			[]string{"/dev/net/tun", `must list "c 10:200"`}},
		{nil, []specs.LinuxDeviceCgroup{allow("c", 195, -1)}, []string{"major 195", `must list "c 195:*"`}},
		{[]specs.LinuxDevice{{Path: "/dev/c8s-nri-test", Type: "c", Major: 1, Minor: 3}}, nil,
			[]string{"/dev/c8s-nri-test", "standard device under another name", `must list "c 1:3"`}},
		{nil, []specs.LinuxDeviceCgroup{allow("c", 195, 7)}, []string{"c 195:7", "agent_policy.allow_devices"}},
	} {
		_, err := adaptDevices(t, p, tc.devs, tc.rules...)
		var fe *ForbiddenError
		if !errors.As(err, &fe) {
			t.Errorf("%+v %+v: err = %v, want a ForbiddenError", tc.devs, tc.rules, err)
			continue
		}
		for _, want := range tc.want {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %q", err, want)
			}
		}
	}
	// Init data that does not mention devices allows only the standard ones.
	none := policyOf(t, "version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	if _, err := adaptDevices(t, none, []specs.LinuxDevice{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0}}); err == nil || !strings.Contains(err.Error(), "agent_policy.allow_devices = []") {
		t.Errorf("init data without allow_devices: err = %v, want a refusal naming the empty setting", err)
	}
	if _, err := adaptDevices(t, none, []specs.LinuxDevice{{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}}, allow("c", 1, 3), allow("c", 136, -1)); err != nil {
		t.Errorf("standard devices under init data without allow_devices: %v", err)
	}
}

func TestDriverMajors(t *testing.T) {
	p := filepath.Join(t.TempDir(), "devices")
	data := "Character devices:\n  1 mem\n 10 misc\n251 virtio-portsdev\n252 tpmrm\n\nBlock devices:\n  8 sd\n254 virtblk\n"
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := DriverMajors(p)
	if err != nil {
		t.Fatal(err)
	}
	if m["virtio-portsdev"] != 251 || m["tpmrm"] != 252 || m["misc"] != 10 {
		t.Errorf("majors = %v", m)
	}
	if _, ok := m["virtblk"]; ok {
		t.Errorf("block majors read as character ones: %v", m)
	}
}

// TestMaliciousHostRenumbersStandardDevices: a standard device number is
// not a capability wherever it lands. /dev/urandom that is /dev/zero gives
// predictable keys, /dev/stderr that is the VM's console (5:1, the serial
// line QEMU gives the host) sends the logs the policy keeps to the host,
// and a node outside /dev hides a file of the pinned image. Refused under
// any policy, but a standard device at another name, which the measured
// policy may allow.
func TestMaliciousHostRenumbersStandardDevices(t *testing.T) {
	policies := map[string]DevicePolicy{
		"no init data": {},
		"init data":    policyOf(t, "version = \"0.1\"\n[agent_policy]\nallow_devices = [\"c 195:0\"]\n"),
	}
	for _, tc := range []struct {
		dev         specs.LinuxDevice
		want        string
		withoutInit bool // refused without init data too
	}{
		{specs.LinuxDevice{Path: "/dev/urandom", Type: "c", Major: 1, Minor: 5}, "/dev/urandom is always c 1:9", true},
		{specs.LinuxDevice{Path: "/dev/random", Type: "c", Major: 1, Minor: 5}, "/dev/random is always c 1:8", true},
		{specs.LinuxDevice{Path: "/dev/urandom", Type: "u", Major: 5, Minor: 1}, "/dev/urandom is always c 1:9", true},
		{specs.LinuxDevice{Path: "/dev/null", Type: "c", Major: 5, Minor: 1}, "/dev/null is always c 1:3", true},
		{specs.LinuxDevice{Path: "/dev/tty", Type: "c", Major: 1, Minor: 5}, "/dev/tty is always c 5:0", true},
		{specs.LinuxDevice{Path: "/dev/urandom", Type: "p"}, "/dev/urandom is always c 1:9", true},
		{specs.LinuxDevice{Path: "/dev/stderr", Type: "c", Major: 5, Minor: 1}, "OCI runtime's own", true},
		{specs.LinuxDevice{Path: "/dev/stdin", Type: "c", Major: 5, Minor: 1}, "OCI runtime's own", true},
		{specs.LinuxDevice{Path: "/dev/console", Type: "c", Major: 5, Minor: 1}, "OCI runtime's own", true},
		{specs.LinuxDevice{Path: "/dev/fd/2", Type: "c", Major: 1, Minor: 3}, "OCI runtime's own", true},
		{specs.LinuxDevice{Path: "/dev/pts/0", Type: "c", Major: 136, Minor: 0}, "OCI runtime's own", true},
		{specs.LinuxDevice{Path: "/dev/shm/x", Type: "p"}, "OCI runtime's own", true},
		{specs.LinuxDevice{Path: "/etc/app/config.yaml", Type: "c", Major: 1, Minor: 3}, "below /dev/", true},
		{specs.LinuxDevice{Path: "/dev/../etc/passwd", Type: "c", Major: 1, Minor: 3}, "below /dev/", true},
		{specs.LinuxDevice{Path: "dev/nvidia0", Type: "c", Major: 195, Minor: 0}, "below /dev/", true},
		{specs.LinuxDevice{Path: "/dev/hwrng", Type: "c", Major: 1, Minor: 5}, `must list "c 1:5"`, false},
		{specs.LinuxDevice{Path: "/dev/ttyX", Type: "c", Major: 5, Minor: 1}, `must list "c 5:1"`, false},
	} {
		for pname, p := range policies {
			t.Run(tc.dev.Path+"/"+tc.dev.Type+"/"+pname, func(t *testing.T) {
				_, err := adaptDevices(t, p, []specs.LinuxDevice{tc.dev})
				if !p.Restricted && !tc.withoutInit {
					if err != nil {
						t.Fatalf("without init data: %v", err)
					}
					return
				}
				var fe *ForbiddenError
				if !errors.As(err, &fe) {
					t.Fatalf("device %+v: err = %v, want a ForbiddenError", tc.dev, err)
				}
				if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.dev.Path) {
					t.Errorf("error %q does not name %s and %q", err, tc.dev.Path, tc.want)
				}
			})
		}
	}
	// The owner may give a standard device another name.
	p := policyOf(t, "version = \"0.1\"\n[agent_policy]\nallow_devices = [\"c 1:3\"]\n")
	if _, err := adaptDevices(t, p, []specs.LinuxDevice{{Path: "/dev/c8s-nri-test", Type: "c", Major: 1, Minor: 3}}); err != nil {
		t.Errorf("a null the policy lists under another name: %v", err)
	}
}

// TestDynamicMajorsOfTheGuestsDrivers: a dynamic major that the policy
// lists by number is refused once the guest's kernel gave it to a driver
// that reaches its disks or device memory (the host chooses the VM's
// devices, and so which driver gets which number).
func TestDynamicMajorsOfTheGuestsDrivers(t *testing.T) {
	p := policyOf(t, "version = \"0.1\"\n[agent_policy]\nallow_devices = [\"c 240:*\"]\n")
	for _, driver := range []string{"nvme", "vfio-dev", "uio"} {
		raw, _ := json.Marshal(&specs.Spec{Process: &specs.Process{Args: []string{"sh"}}, Linux: &specs.Linux{
			Devices: []specs.LinuxDevice{{Path: "/dev/x0", Type: "c", Major: 240, Minor: 0}},
		}})
		_, err := Adapt(raw, Options{ContainerID: "c1", Exists: guestHas(), Devices: p, DriverMajors: map[string]int64{driver: 240}})
		var fe *ForbiddenError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "never given") {
			t.Errorf("major 240 of %s: err = %v, want the guest's own device refused", driver, err)
		}
	}
}

// TestMaliciousHostHidesANUL: "/dev/urandom\x00" is a clean path below
// /dev that names none of the canonical or runtime paths, but crun, in C,
// reads it only up to the NUL and would make /dev/urandom a FIFO or the
// policy's allowed GPU. No string of a spec may hold a NUL, at create or
// exec; an escaped backslash before "u0000" is no NUL.
func TestMaliciousHostHidesANUL(t *testing.T) {
	p := policyOf(t, "version = \"0.1\"\n[agent_policy]\nallow_devices = [\"c 195:0\"]\n")
	for _, dev := range []specs.LinuxDevice{
		{Path: "/dev/urandom\x00", Type: "p"},
		{Path: "/dev/console\x00", Type: "p"},
		{Path: "/dev/urandom\x00", Type: "c", Major: 195, Minor: 0},
	} {
		for _, pol := range []DevicePolicy{{}, p} {
			_, err := adaptDevices(t, pol, []specs.LinuxDevice{dev})
			var fe *ForbiddenError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), "NUL") {
				t.Errorf("device %q: err = %v, want a ForbiddenError naming the NUL", dev.Path, err)
			}
		}
	}
	raw, _ := json.Marshal(&specs.Process{Args: []string{"/bin/sh\x00", "-c", "id"}, Cwd: "/"})
	if _, err := AdaptProcess(raw, false); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("an exec with a NUL in an argument: err = %v", err)
	}
	if !hasNUL([]byte(`{"a":"x\u0000"}`)) || hasNUL([]byte(`{"a":"x\\u0000"}`)) || hasNUL([]byte(`{"a":"\\\\"}`)) || !hasNUL([]byte(`["\\\u0000"]`)) {
		t.Error("hasNUL misreads the escapes")
	}
}
