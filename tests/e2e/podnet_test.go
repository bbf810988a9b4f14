package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

// Network of TestCRIPodNetwork: its own bridge and subnet, so that it
// does not meet the conformance run's.
const (
	podnetBridge  = "c8se2enet0"
	podnetSubnet  = "10.231.7.0/24"
	podnetGateway = "10.231.7.1"
)

// TestCRIPodNetwork runs a CNI-networked pod (the bridge plugin, as a
// cluster's default network) with handler c8s: the pod VM is wired to the
// pod's network namespace, so the IP CRI reports for the pod answers ping
// and HTTP from the host (busybox httpd in the pod), and the pod reaches a
// server on the host through the bridge.
func TestCRIPodNetwork(t *testing.T) {
	e, _ := setupCRIWithCNI(t, podnetBridge, podnetSubnet, podnetGateway)

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	pod := runCRIPod(ctx, t, e, &cri.PodSandboxConfig{
		Metadata: &cri.PodSandboxMetadata{Name: "netpod", Namespace: "default", Uid: "uid-netpod-1"},
		Hostname: "netpod",
	})
	rt := pod.rt
	st, err := rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: pod.id})
	if err != nil {
		t.Fatal(err)
	}
	podIP := st.GetStatus().GetNetwork().GetIp()
	_, subnet, _ := net.ParseCIDR(podnetSubnet)
	if ip := net.ParseIP(podIP); ip == nil || !subnet.Contains(ip) {
		t.Fatalf("pod IP %q is not in the CNI subnet %s", podIP, podnetSubnet)
	}
	t.Logf("pod IP %s", podIP)

	// A server on the host, on the bridge's address, for the pod to reach.
	ln, err := net.Listen("tcp", podnetGateway+":0")
	if err != nil {
		t.Fatal(err)
	}
	hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host answers %s", r.RemoteAddr)
	})}
	go hostSrv.Serve(ln)
	t.Cleanup(func() { hostSrv.Close() })

	ctr := pod.start(t, &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: "web"},
		Image:    &cri.ImageSpec{Image: image},
		Command: []string{"sh", "-c", "mkdir -p /tmp/www && echo hello from the pod VM >/tmp/www/index.html && " +
			"exec busybox httpd -f -p 8080 -h /tmp/www"},
		// For brctl below, as critest's "adding capability" spec does.
		Linux: &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{
			Capabilities: &cri.Capability{AddCapabilities: []string{"NET_ADMIN"}},
		}},
	})
	execIn := func(cmd ...string) string {
		t.Helper()
		res, err := rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: ctr, Cmd: cmd, Timeout: 60})
		if err != nil {
			t.Fatalf("ExecSync %v: %v", cmd, err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("ExecSync %v: exit %d, stdout %q, stderr %q", cmd, res.ExitCode, res.Stdout, res.Stderr)
		}
		return string(res.Stdout)
	}

	// The container sees the pod's interface with the pod's IP.
	if out := execIn("busybox", "ip", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(out, " "+podIP+"/") {
		t.Fatalf("eth0 in the container: %q, want the pod IP %s", out, podIP)
	}

	// The bridge modules are there for a container that makes a bridge
	// (the guest has no modprobe to load them on demand).
	execIn("busybox", "brctl", "addbr", "c8sbr0")
	if out := execIn("busybox", "ip", "-o", "link", "show", "c8sbr0"); !strings.Contains(out, "c8sbr0") {
		t.Fatalf("bridge made in the container: %q", out)
	}

	// The host reaches the pod: ping, then HTTP (httpd may still be
	// starting: retry until it answers or the test's context ends).
	ping := exec.CommandContext(ctx, "busybox", "ping", "-c", "3", "-W", "10", podIP)
	if out, err := ping.CombinedOutput(); err != nil {
		t.Fatalf("ping %s from the host: %v\n%s", podIP, err, out)
	}
	body := httpGet(ctx, t, "http://"+net.JoinHostPort(podIP, "8080")+"/index.html")
	if body != "hello from the pod VM\n" {
		t.Fatalf("HTTP from the pod: %q", body)
	}

	// The pod reaches the host, from the pod's IP.
	hostURL := "http://" + ln.Addr().String() + "/"
	if out := execIn("busybox", "wget", "-q", "-O", "-", hostURL); !strings.HasPrefix(out, "host answers "+podIP+":") {
		t.Fatalf("pod fetching %s: %q, want an answer to the pod's IP %s", hostURL, out, podIP)
	}

	// CRI port-forward (kubectl port-forward): containerd dials the port
	// on the loopback of the pod's network namespace on the host, where
	// the shim mirrors the pod's listening ports (shim/portfwd).
	if body := portForwardGet(ctx, t, rt, pod.id, 8080, "/index.html"); body != "hello from the pod VM\n" {
		t.Fatalf("HTTP through CRI port-forward: %q", body)
	}

	pod.remove(t, ctr)
}

// portForwardGet fetches path from the pod's port through CRI
// PortForward, as kubectl port-forward does (SPDY to containerd's
// streaming server). A forward whose first connection fails ends (as
// kubectl's does), so each attempt is a new PortForward, retried for up
// to a minute while the pod's server may still be starting.
func portForwardGet(ctx context.Context, t *testing.T, rt cri.RuntimeServiceClient, podID string, port int32, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		body, err := portForwardOnce(ctx, rt, podID, port, path)
		if err == nil {
			return body
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("HTTP GET %s through CRI port-forward to port %d: %v", path, port, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func portForwardOnce(ctx context.Context, rt cri.RuntimeServiceClient, podID string, port int32, path string) (string, error) {
	resp, err := rt.PortForward(ctx, &cri.PortForwardRequest{PodSandboxId: podID, Port: []int32{port}})
	if err != nil {
		return "", fmt.Errorf("CRI PortForward: %w", err)
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		return "", err
	}
	transport, upgrader, err := spdy.RoundTripperFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	if err != nil {
		return "", err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	defer close(stop)
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return "", err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errc:
		return "", fmt.Errorf("port-forward: %w", err)
	case <-ctx.Done():
		return "", ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		return "", fmt.Errorf("port-forward ports: %v %v", ports, err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", ports[0].Local, path), nil)
	hr, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer hr.Body.Close()
	b, err := io.ReadAll(hr.Body)
	if err != nil || hr.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %s, read error %v", hr.Status, err)
	}
	return string(b), nil
}

// setupCRIWithCNI is setupCRI with a CNI bridge network for the pods
// (bridgeNetwork); it also returns host-local's allocations directory.
func setupCRIWithCNI(t *testing.T, bridge, subnet, gateway string) (*env, string) {
	t.Helper()
	cniBin, cniConf := bridgeNetwork(t, bridge, subnet, gateway)
	e := setupCRIWith(t, fmt.Sprintf(`
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [%q]
  conf_dir = %q
`, cniBin, cniConf))
	return e, filepath.Join(cniConf, "ipam")
}

// bridgeNetwork writes a CNI configuration for pods on a bridge (deleted
// at cleanup) with subnet and gateway, IPs from host-local (allocations
// under <cniConf>/ipam), and returns the plugins' and the configuration's
// directories for containerd's CRI.
func bridgeNetwork(t *testing.T, bridge, subnet, gateway string) (cniBin, cniConf string) {
	t.Helper()
	cniBin = filepath.Join(containerdtest.ToolsBin(t), "cni")
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBin, p)); err != nil {
			containerdtest.SkipOrFail(t, "CNI plugin %s not found in %s: run make tools", p, cniBin)
		}
	}
	cniConf = t.TempDir()
	conflist := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "c8s-e2e-%s", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": %q}}]}`, bridge, bridge, subnet, gateway, filepath.Join(cniConf, "ipam"))
	if err := os.WriteFile(filepath.Join(cniConf, "10-c8s-e2e.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", bridge).Run() })
	return cniBin, cniConf
}

// httpGet fetches url, retrying until it answers or ctx ends.
func httpGet(ctx context.Context, t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return string(b)
			}
			err = fmt.Errorf("status %s, read error %v", resp.Status, rerr)
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("GET %s: %v", url, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
