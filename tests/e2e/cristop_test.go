package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stopMargin is how much longer than its timeout a CRI stop may take: the
// exit's way from the guest through the shim to containerd, under TCG. A
// stop that hangs (containerd waiting for output that never ends) takes
// minutes.
const stopMargin = 10 * time.Second

// TestCRIStopForkingContainers stops, through CRI as the kubelet does,
// containers whose main process has children that inherited its stdout,
// in each PID namespace mode, with a short timeout. Each stop completes
// within its timeout plus stopMargin, the container shows EXITED, nothing
// of it is left in the VM, and removing it and the pod (whose pause
// stand-in also forks and traps SIGTERM) leaves nothing on the host.
// containerd joins a container to the pod's PID namespace unless the pod
// itself is hostPID, so the host-PID cases run in a hostPID pod. Two VMs.
func TestCRIStopForkingContainers(t *testing.T) {
	e := setupCRI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	type stopCase struct {
		name   string
		pid    cri.NamespaceMode
		script string
	}
	for _, pc := range []struct {
		name    string
		hostPID bool
		cases   []stopCase
	}{
		{"hostpid", true, []stopCase{
			// sh is not PID 1: SIGTERM ends it, its children stay.
			{"host-pid", cri.NamespaceMode_NODE, "sleep 1001 & sleep 1001"},
			// sh is PID 1 and ignores SIGTERM: CRI's SIGKILL after the timeout.
			{"own-pid", cri.NamespaceMode_CONTAINER, "sleep 1003 & sleep 1003"},
		}},
		{"podpid", false, []stopCase{
			// The pod's PID namespace, whose PID 1 is the pause stand-in.
			{"pod-pid", cri.NamespaceMode_POD, `trap "exit 0" TERM; sleep 1002 & wait`},
		}},
	} {
		t.Run(pc.name, func(t *testing.T) {
			cfg := hostNetworkPod("forking-" + pc.name)
			watcherPID := cri.NamespaceMode_POD
			if pc.hostPID {
				cfg.Linux.SecurityContext.NamespaceOptions.Pid = cri.NamespaceMode_NODE
				watcherPID = cri.NamespaceMode_NODE
			}
			pod := runCRIPod(ctx, t, e, cfg)
			// The watcher sees every process of the cases' containers.
			watcher := pod.start(t, shellContainer("watcher", watcherPID, "exec sleep 600"))
			// exec runs script in the watcher; processes that end while it
			// reads /proc make sh complain on stderr, which is dropped.
			exec := func(script string) (string, error) {
				resp, err := pod.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: watcher, Cmd: []string{"sh", "-c", script}, Timeout: 60})
				if err != nil {
					return "", err
				}
				return string(resp.Stdout), nil
			}
			running := func(t *testing.T, tag string) int {
				t.Helper()
				// The processes whose command line names the tag: the
				// container's shell and its sleeps (busybox may run an applet
				// inside the shell's own process). The brackets keep grep
				// from counting itself.
				out, err := exec(fmt.Sprintf(`for f in /proc/[0-9]*/cmdline; do tr "\0" " " <$f; echo; done | grep -c "[s]leep %s"`, tag))
				if err != nil {
					t.Fatalf("ExecSync in the watcher: %v", err)
				}
				n, err := strconv.Atoi(strings.TrimSpace(out))
				if err != nil {
					t.Fatalf("counting processes: %q: %v", out, err)
				}
				return n
			}
			processes := func() string {
				out, err := exec(`for f in /proc/[0-9]*; do echo "$f $(tr "\0" " " <$f/cmdline)"; done`)
				if err != nil {
					return err.Error()
				}
				return out
			}

			for _, tc := range pc.cases {
				t.Run(tc.name, func(t *testing.T) {
					tag := strings.Fields(tc.script[strings.Index(tc.script, "sleep "):])[1]
					id := pod.start(t, shellContainer(tc.name, tc.pid, tc.script))
					deadline := time.Now().Add(time.Minute)
					for running(t, tag) < 2 && time.Now().Before(deadline) {
						time.Sleep(200 * time.Millisecond)
					}
					if n := running(t, tag); n < 2 {
						t.Fatalf("the container and its child never showed (%d of its processes running); the processes the watcher sees:\n%s", n, processes())
					}

					const timeout = 2
					t0 := time.Now()
					if _, err := pod.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: timeout}); err != nil {
						t.Fatalf("StopContainer after %s: %v\ncontainerd log:\n%s", time.Since(t0), err, e.d.Log())
					}
					took := time.Since(t0)
					t.Logf("StopContainer --timeout %d took %s", timeout, took.Round(time.Millisecond))
					if took > timeout*time.Second+stopMargin {
						t.Errorf("StopContainer took %s, more than its timeout of %d s plus %s", took, timeout, stopMargin)
					}
					st, err := pod.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
					if err != nil {
						t.Fatal(err)
					}
					if st.Status.State != cri.ContainerState_CONTAINER_EXITED {
						t.Errorf("container state after stop = %s, want EXITED", st.Status.State)
					}
					if n := running(t, tag); n != 0 {
						t.Errorf("%d of the container's processes still run in the VM after its stop:\n%s", n, processes())
					}
					t0 = time.Now()
					if _, err := pod.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
						t.Fatalf("RemoveContainer: %v", err)
					}
					if took := time.Since(t0); took > stopMargin {
						t.Errorf("RemoveContainer took %s", took)
					}
				})
			}

			t0 := time.Now()
			pod.remove(t, watcher) // with the checks that nothing is left
			if took := time.Since(t0); took > 5*time.Second+2*stopMargin {
				t.Errorf("stopping and removing the watcher and the pod took %s", took)
			}
		})
	}
}

// shellContainer is the config of a container running script with sh, in
// the PID namespace mode pid.
func shellContainer(name string, pid cri.NamespaceMode, script string) *cri.ContainerConfig {
	return &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: name},
		Image:    &cri.ImageSpec{Image: image},
		Command:  []string{"sh", "-c", script},
		Linux: &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: pid},
		}},
	}
}
