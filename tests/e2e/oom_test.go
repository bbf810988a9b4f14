package e2e

import (
	"context"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIOOMKilled runs a container that outgrows its memory limit: the
// guest kernel's OOM killer kills it inside the pod VM, and CRI reports it
// as runc's pods are reported, exit code 137 with reason OOMKilled.
func TestCRIOOMKilled(t *testing.T) {
	e := setupCRI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pod := runCRIPod(ctx, t, e, hostNetworkPod("oom"))
	ctr := pod.start(t, &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: "hog"},
		Image:    &cri.ImageSpec{Image: image},
		// dd's 128 MiB block is touched as it fills from /dev/zero.
		Command: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=128M", "count=4"},
		Linux: &cri.LinuxContainerConfig{Resources: &cri.LinuxContainerResources{
			MemoryLimitInBytes: 32 << 20,
		}},
	})
	var st *cri.ContainerStatus
	for {
		resp, err := pod.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ctr})
		if err != nil {
			t.Fatalf("ContainerStatus: %v", err)
		}
		st = resp.Status
		if st.State == cri.ContainerState_CONTAINER_EXITED {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the container did not exit: %v", st)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if st.Reason != "OOMKilled" || st.ExitCode != 137 {
		t.Fatalf("exited container: reason %q exit code %d, want OOMKilled 137", st.Reason, st.ExitCode)
	}
	if _, err := pod.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: ctr}); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	pod.remove(t)
}
