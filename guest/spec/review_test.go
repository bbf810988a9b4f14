package spec

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A device entry whose fileMode carries file-type bits: crun ORs fileMode
// into mknod's mode, so 0o60666 on an allowed char device 1:3 would make the
// block device 1:3, and on c 8:0 the block device holding a container's
// root disk.
func TestMaliciousHostDeviceFileMode(t *testing.T) {
	for _, mode := range []os.FileMode{0o60666, 0o20666, 0o10666} {
		m := mode
		_, err := adaptDevices(t, DevicePolicy{}, []specs.LinuxDevice{{Path: "/dev/x", Type: "c", Major: 1, Minor: 3, FileMode: &m}})
		var fe *ForbiddenError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "fileMode") {
			t.Errorf("fileMode %#o: err = %v, want a ForbiddenError naming fileMode", uint32(mode), err)
		}
	}
	ok := os.FileMode(0o666)
	if _, err := adaptDevices(t, DevicePolicy{}, []specs.LinuxDevice{{Path: "/dev/x", Type: "c", Major: 1, Minor: 3, FileMode: &ok}}); err != nil {
		t.Errorf("fileMode 0666: %v", err)
	}
}

// cgroup v2 files in linux.resources.unified that are not controller
// limits would let the host move the agent (PID 1) or another container's
// processes into this container's cgroup, where a kill of the container
// reaches them.
func TestMaliciousHostUnifiedCgroupFiles(t *testing.T) {
	for _, key := range []string{"cgroup.procs", "cgroup.threads", "cgroup.kill", "cgroup.subtree_control", "../x", "a/b"} {
		s := specs.Spec{Process: &specs.Process{Args: []string{"sh"}}, Linux: &specs.Linux{
			Resources: &specs.LinuxResources{Unified: map[string]string{key: "1"}},
		}}
		raw, _ := json.Marshal(&s)
		_, err := Adapt(raw, Options{ContainerID: "c1", Rootfs: "/r", Exists: guestHas(), DriverMajors: guestDrivers})
		var fe *ForbiddenError
		if !errors.As(err, &fe) {
			t.Errorf("unified %q: err = %v, want a ForbiddenError", key, err)
		}
	}
	s := specs.Spec{Process: &specs.Process{Args: []string{"sh"}}, Linux: &specs.Linux{
		Resources: &specs.LinuxResources{Unified: map[string]string{"memory.high": "100M"}},
	}}
	raw, _ := json.Marshal(&s)
	if _, err := Adapt(raw, Options{ContainerID: "c1", Rootfs: "/r", Exists: guestHas(), DriverMajors: guestDrivers}); err != nil {
		t.Errorf("unified memory.high: %v", err)
	}
}

// A hostile cpuset list costs the agent a bounded bitmap, not memory in
// proportion to its ranges.
func TestParseListBounded(t *testing.T) {
	if _, err := ParseList("0-65535"); err == nil {
		t.Error("ParseList(0-65535): no error, want members beyond any system refused")
	}
	big := strings.TrimSuffix(strings.Repeat("0-8191,", 500), ",")
	got, err := ParseList(big)
	if err != nil || len(got) != 8192 || got[0] != 0 || got[8191] != 8191 {
		t.Errorf("ParseList(500 × 0-8191) = %d members, %v", len(got), err)
	}
}

// TestMaliciousHostDuplicateNamespace: a second pid entry, joining the
// sandbox's, after a fresh one the policy judges: crun, with a user
// namespace, joins the one with a path and drops the fresh one.
func TestMaliciousHostDuplicateNamespace(t *testing.T) {
	raw, _ := json.Marshal(&specs.Spec{Process: &specs.Process{Args: []string{"sh"}}, Linux: &specs.Linux{
		Namespaces: []specs.LinuxNamespace{{Type: "pid"}, {Type: "mount"}, {Type: "user"}, {Type: "pid", Path: "/proc/77/ns/pid"}},
	}})
	_, err := Adapt(raw, Options{ContainerID: "c1", Exists: guestHas()})
	var fe *ForbiddenError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "pid namespace twice") {
		t.Fatalf("two pid namespaces: err = %v, want a ForbiddenError", err)
	}
}

// TestMaliciousHostSharedMountSuid: the host sets the owner and mode of
// every file of a virtio-fs share (uid 0, 04755). crun remounts a bind
// with the spec's flags alone, so the share's own nosuid,nodev would not
// hold: the bind must say them, whatever the host's options were.
func TestMaliciousHostSharedMountSuid(t *testing.T) {
	raw, _ := json.Marshal(&specs.Spec{Process: &specs.Process{Args: []string{"sh"}}, Mounts: []specs.Mount{
		{Destination: "/tools", Type: "bind", Source: "/var/lib/kubelet/pods/p/volumes/x/tools", Options: []string{"rbind", "ro", "suid", "dev"}},
	}})
	plan, err := Adapt(raw, Options{ContainerID: "c1", Exists: guestHas(), Shared: map[string]string{"/var/lib/kubelet/pods/p/volumes/x/tools": "/run/c8s/shared/c1-0"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range plan.Spec.Mounts {
		if m.Destination == "/tools" {
			got = m.Options
		}
	}
	if !slices.Contains(got, "nosuid") || !slices.Contains(got, "nodev") || slices.Contains(got, "suid") || slices.Contains(got, "dev") || !slices.Contains(got, "ro") {
		t.Fatalf("the shared bind's options are %v, want ro kept, nosuid and nodev, no suid or dev", got)
	}
}
