package agent

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
)

func devRule(typ string, major, minor int64, acc string) specs.LinuxDeviceCgroup {
	return specs.LinuxDeviceCgroup{Allow: true, Type: typ, Major: &major, Minor: &minor, Access: acc}
}

// TestInjectedDeviceIsCreated: a device an NRI plugin adds (linux.devices
// and its cgroup rule, as containerd's NRI adaptation writes them) appears
// in the container and opens, as with runc on a host, though its path
// does not exist in the guest.
func TestInjectedDeviceIsCreated(t *testing.T) {
	e := newEnv(t)
	s := e.spec(t, "sh", "-c", "ls -l /dev/c8s-nri-test && echo x >/dev/c8s-nri-test && echo written")
	mode := os.FileMode(0o666)
	s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: "/dev/c8s-nri-test", Type: "c", Major: 1, Minor: 3, FileMode: &mode})
	s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, devRule("c", 1, 3, "rwm"))
	e.create(t, "dev1", s, pipes(), nil)
	e.start(t, "dev1")
	if st := e.wait(t, "dev1", ""); st != 0 {
		t.Errorf("exit status %d; stderr %q", st, e.readAll(t, "dev1", "", true))
	}
	out := e.readAll(t, "dev1", "", false)
	if !regexp.MustCompile(`(?m)^crw-rw-rw-.* 1, +3 .*/dev/c8s-nri-test\nwritten\n$`).MatchString(out) {
		t.Errorf("stdout = %q, want the char device 1, 3 listed and written", out)
	}
	e.remove(t, "dev1")
}

// TestMaliciousHostDeviceRefused: a host asking for the TEE guest device
// or a disk gets a PermissionDenied naming the device and the policy, and
// nothing is left; a container that creates the guest's memory device
// itself cannot open it (the device cgroup starts from deny all).
func TestMaliciousHostDeviceRefused(t *testing.T) {
	e := newEnv(t)
	for _, dev := range []specs.LinuxDevice{
		{Path: "/dev/sev-guest", Type: "c", Major: 10, Minor: 124},
		{Path: "/dev/sda", Type: "b", Major: 8, Minor: 0},
	} {
		s := e.spec(t, "true")
		s.Linux.Devices = append(s.Linux.Devices, dev)
		_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, s), Rootfs: rootfsReq(), Stdio: pipes()})
		assertCode(t, err, codes.PermissionDenied)
		if err == nil || !strings.Contains(err.Error(), dev.Path) || !strings.Contains(err.Error(), "agent_policy.allow_devices") {
			t.Errorf("device %s: error %v does not name the device and the policy setting", dev.Path, err)
		}
		e.assertGone(t, "evil")
	}

	// Under the measured policy, a device it does not list is refused too.
	doc, err := initdata.Parse([]byte("version = \"0.1\"\n[agent_policy]\nallow_devices = [\"c 10:229\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	e.svc.mu.Lock()
	e.svc.policy = doc.Agent
	e.svc.mu.Unlock()
	s := e.spec(t, "true")
	s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: "/dev/net/tun", Type: "c", Major: 10, Minor: 200})
	_, err = e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, s), Rootfs: rootfsReq(), Stdio: pipes()})
	assertCode(t, err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), `must list "c 10:200"`) {
		t.Errorf("tun under a policy without it: %v", err)
	}

	// Standard numbers at the paths programs trust (/dev/urandom
	// that is /dev/zero, /dev/stderr that is the VM's serial console).
	for _, dev := range []specs.LinuxDevice{
		{Path: "/dev/urandom", Type: "c", Major: 1, Minor: 5},
		{Path: "/dev/stderr", Type: "c", Major: 5, Minor: 1},
	} {
		s = e.spec(t, "true")
		s.Linux.Devices = append(s.Linux.Devices, dev)
		_, err = e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, s), Rootfs: rootfsReq(), Stdio: pipes()})
		assertCode(t, err, codes.PermissionDenied)
		if err == nil || !strings.Contains(err.Error(), dev.Path) {
			t.Errorf("%s as c %d:%d: %v", dev.Path, dev.Major, dev.Minor, err)
		}
		e.assertGone(t, "evil")
	}

	// The host's spec grants /dev/null only; the container makes
	// /dev/mem's node itself (CAP_MKNOD) and cannot open it.
	s = e.spec(t, "sh", "-c", "mknod /dev/m c 1 1 && mknod /dev/n c 1 3 && echo >/dev/n && echo null ok; head -c 1 /dev/m >/dev/null 2>&1 && echo MEM READ")
	s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, devRule("c", 1, 3, "rwm"))
	s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_MKNOD")
	s.Process.Capabilities.Effective = append(s.Process.Capabilities.Effective, "CAP_MKNOD")
	s.Process.Capabilities.Permitted = append(s.Process.Capabilities.Permitted, "CAP_MKNOD")
	if out := e.run(t, "mknod", s); out != "null ok\n" {
		t.Errorf("stdout = %q, want /dev/null usable and /dev/mem not; stderr %q", out, e.readAll(t, "mknod", "", true))
	}
}

// TestCPUSetOutsideThePodVM: a cpuset naming CPUs the guest does not have
// fails the create with what was asked, what the VM has and what to do.
func TestCPUSetOutsideThePodVM(t *testing.T) {
	e := newEnv(t)
	sys := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sys, "devices/system/cpu"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "devices/system/cpu/online"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.svc.cfg.SysDir = sys // before any request
	s := e.spec(t, "true")
	if s.Linux.Resources == nil {
		s.Linux.Resources = &specs.LinuxResources{}
	}
	s.Linux.Resources.CPU = &specs.LinuxCPU{Cpus: "5-6"}
	_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "cpus", Spec: mustJSON(t, s), Rootfs: rootfsReq(), Stdio: pipes()})
	assertCode(t, err, codes.InvalidArgument)
	for _, want := range []string{"CPUs 5-6", "only CPUs 0 (1 vCPU)", "default_vcpus"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
	e.assertGone(t, "cpus")

	s.Linux.Resources.CPU = &specs.LinuxCPU{Cpus: "0"}
	e.create(t, "cpu0", s, pipes(), nil)
	e.remove(t, "cpu0")
}
