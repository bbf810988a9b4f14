package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// runcUTSError is what runc says, and c8s with it, when a spec sets a
// hostname but shares the node's UTS namespace.
const runcUTSError = "unable to set hostname without a private UTS namespace"

// hostNetPort is the port the host-network pod serves, mirrored onto the
// node's loopback for port-forward: one that is free here.
const hostNetPort = 38517

// TestCRIHostNetworkPodAsTheNode checks, through containerd's CRI, what a
// host-network pod shows of the node as it does with runc:
//
//   - RunPodSandbox of a host-network pod with a hostname fails, with c8s
//     before any VM boots, as with runc (compared when runc is installed);
//   - in a host-network pod without one (as the kubelet makes them), a
//     container's `hostname`, $HOSTNAME and /etc/hostname are the node's;
//   - CRI port-forward to the pod's port reaches its server (containerd
//     dials the node's localhost, where the shim mirrors the pod's ports);
//   - the pid CRI reports for the pod (PodSandboxStatus) and for its
//     container (ContainerStatus) is the pod's QEMU: a live host process
//     whose command line names the test's state dir, not a guest pid.
//
// One VM.
func TestCRIHostNetworkPodAsTheNode(t *testing.T) {
	e := setupCRI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nodeName, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("custom-hostname-refused", func(t *testing.T) {
		conn, err := grpc.NewClient("unix://"+e.d.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		rt := cri.NewRuntimeServiceClient(conn)
		handlers := []string{"c8s"}
		if _, err := exec.LookPath("runc"); err == nil {
			handlers = append(handlers, "runc")
		} else {
			t.Log("runc is not installed: c8s's refusal is not compared with runc's")
		}
		for _, handler := range handlers {
			cfg := hostNetworkPod("named-" + handler)
			cfg.Hostname = "custom-name"
			resp, err := rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
			if err == nil {
				rt.StopPodSandbox(context.Background(), &cri.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId})
				rt.RemovePodSandbox(context.Background(), &cri.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId})
				t.Errorf("RunPodSandbox of a host-network pod with hostname %q and handler %s succeeded; want the error runc gives", cfg.Hostname, handler)
				continue
			}
			t.Logf("%s: %v", handler, err)
			if !strings.Contains(err.Error(), runcUTSError) {
				t.Errorf("RunPodSandbox with handler %s: %v; want an error saying %q", handler, err, runcUTSError)
			}
		}
		if q := e.qemus(t); len(q) != 0 {
			t.Errorf("QEMU processes for a refused pod: %v, want none", q)
		}
	})

	pod := runCRIPod(ctx, t, e, hostNetworkPod("as-the-node"))
	ctr := pod.start(t, &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: "app"},
		Image:    &cri.ImageSpec{Image: image},
		// A web server on the pod's port for port-forward, and a process
		// that stays.
		Command: []string{"sh", "-c", fmt.Sprintf("mkdir -p /tmp/www && echo hello from a host-network pod >/tmp/www/index.html && busybox httpd -p %d -h /tmp/www; exec sleep 600", hostNetPort)},
	})

	t.Run("hostname", func(t *testing.T) {
		res, err := pod.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: ctr,
			Cmd: []string{"sh", "-c", `hostname; echo "$HOSTNAME"; cat /etc/hostname`}, Timeout: 60})
		if err != nil {
			t.Fatalf("ExecSync: %v", err)
		}
		lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
		if res.ExitCode != 0 || len(lines) != 3 {
			t.Fatalf("ExecSync: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		for i, what := range []string{"hostname", "$HOSTNAME", "/etc/hostname"} {
			if lines[i] != nodeName {
				t.Errorf("%s in a host-network pod's container = %q, want the node's name %q", what, lines[i], nodeName)
			}
		}
	})

	// containerd forwards a host-network pod's port by dialing the node's
	// localhost: the shim mirrors the pod's ports onto the node's loopback.
	t.Run("port-forward", func(t *testing.T) {
		if body := portForwardGet(ctx, t, pod.rt, pod.id, hostNetPort, "/index.html"); body != "hello from a host-network pod\n" {
			t.Fatalf("HTTP through CRI port-forward: %q", body)
		}
	})

	t.Run("pid", func(t *testing.T) {
		qemus := e.qemus(t)
		if len(qemus) != 1 {
			t.Fatalf("QEMU processes of the pod: %v, want 1", qemus)
		}
		ps, err := pod.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: pod.id, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		cs, err := pod.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ctr, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		for what, info := range map[string]map[string]string{"PodSandboxStatus": ps.Info, "ContainerStatus": cs.Info} {
			var v struct {
				Pid int `json:"pid"`
			}
			if err := json.Unmarshal([]byte(info["info"]), &v); err != nil {
				t.Fatalf("%s verbose info: %v\n%s", what, err, info["info"])
			}
			if v.Pid != qemus[0] {
				t.Errorf("%s pid = %d, want the pod's QEMU %d", what, v.Pid, qemus[0])
			}
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", v.Pid))
			if err != nil {
				t.Errorf("%s pid %d is no live host process: %v", what, v.Pid, err)
				continue
			}
			if cmd := strings.ReplaceAll(string(cmdline), "\x00", " "); !strings.Contains(cmd, "qemu-system") || !strings.Contains(cmd, e.stateDir) {
				t.Errorf("%s pid %d runs %q, not the pod's QEMU (state dir %s)", what, v.Pid, cmd, e.stateDir)
			}
		}
	})

	pod.remove(t, ctr)
}
