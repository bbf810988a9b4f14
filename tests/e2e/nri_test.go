package e2e

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/tests/internal/nriplugin"
)

// TestCRINRIAdjustments runs, in one pod VM (1 vCPU, no init data),
// containers that an NRI plugin adjusts as device and resource-management
// plugins do (tests/internal/nriplugin):
//
//   - a character device the plugin injects (c 1:3 at /dev/c8s-nri-test)
//     appears in the container, as with runc, and opens;
//   - the guest's device cgroup keeps a container from opening a guest
//     device it creates itself (/dev/mem's number, with CAP_MKNOD);
//   - a device number of the guest's own (misc, where the TEE guest
//     devices live) is refused, naming the device and the policy setting;
//   - a cpuset of CPUs the VM does not have ("5-6") is refused, naming the
//     CPUs asked, those the VM has, and what to do.
func TestCRINRIAdjustments(t *testing.T) {
	e := setupCRIOptions(t, "", true)
	plugin := nriplugin.Start(t, nriplugin.Options{
		Socket: e.d.NRISocket,
		Devices: map[string]nriplugin.Device{
			"null":      {Path: "/dev/c8s-nri-test", Type: "c", Major: 1, Minor: 3, Mode: 0o666},
			"sev-guest": {Path: "/dev/c8s-nri-sev", Type: "c", Major: 10, Minor: 124, Mode: 0o600},
		},
		CPUs: "5-6",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pod := runCRIPod(ctx, t, e, hostNetworkPod("nri"))
	container := func(name, adjust string) *cri.ContainerConfig {
		c := shellContainer(name, cri.NamespaceMode_POD, "exec sleep 600")
		c.Annotations = map[string]string{nriplugin.Annotation: adjust}
		return c
	}

	dev := pod.start(t, container("nri-device", "null"))
	exec := func(script string) (string, int32) {
		t.Helper()
		resp, err := pod.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: dev, Cmd: []string{"sh", "-c", script}, Timeout: 60})
		if err != nil {
			t.Fatalf("ExecSync %q: %v", script, err)
		}
		return string(resp.Stdout) + string(resp.Stderr), resp.ExitCode
	}
	out, code := exec("ls -l /dev/c8s-nri-test && echo x >/dev/c8s-nri-test && echo written")
	if code != 0 || !regexp.MustCompile(`(?m)^crw-rw-rw-.* 1, +3 .*/dev/c8s-nri-test\nwritten\n$`).MatchString(out) {
		t.Errorf("the injected device: exit %d, output %q; want c 1, 3, mode 0666, writable", code, out)
	}
	out, code = exec("mknod /dev/c8s-null c 1 3 && echo >/dev/c8s-null && echo null ok; mknod /dev/c8s-mem c 1 1 && echo made && head -c 1 /dev/c8s-mem >/dev/null && echo MEM READ")
	if !strings.HasPrefix(out, "null ok\nmade\n") || !strings.Contains(out, "Operation not permitted") || strings.Contains(out, "MEM READ") {
		t.Errorf("a node of /dev/mem's number made in the container: exit %d, output %q; want it made but not opened (and a node of /dev/null's usable)", code, out)
	}

	// Refused adjustments fail the container's creation (CRI's create, or
	// the task create of its start) with the agent's reason.
	refused := func(name, adjust string, wants ...string) {
		t.Helper()
		ctr, err := pod.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: pod.id, Config: container(name, adjust), SandboxConfig: pod.cfg})
		if err == nil {
			_, err = pod.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: ctr.ContainerId})
			defer pod.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: ctr.ContainerId})
		}
		if err == nil {
			t.Errorf("container %s (%s) started", name, adjust)
			return
		}
		t.Logf("%s: %v", name, err)
		for _, want := range wants {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("container %s: error %q does not say %q", name, err, want)
			}
		}
	}
	refused("nri-sev", "sev-guest", "/dev/c8s-nri-sev (c 10:124)", "misc device", "agent_policy.allow_devices")
	refused("nri-cpuset", "cpuset", "CPUs 5-6", "has only CPUs 0 (1 vCPU)", "default_vcpus")

	if got := plugin.Adjusted(); len(got) != 3 {
		t.Errorf("the plugin adjusted %v, want the 3 containers", got)
	}
	pod.remove(t, dev)
}
