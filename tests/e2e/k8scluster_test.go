package e2e

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

// cluster is a one-node Kubernetes on loopback: etcd, kube-apiserver,
// kube-scheduler and a kubelet on the test's containerd. By default there
// is no kube-controller-manager: the test needs no controller (the kubelet
// deletes terminated pods itself), and pods run with host networking and
// no service-account token. clusterOptions.controllers adds one, for
// tests of workloads (a Deployment) and of the service-account token.
type cluster struct {
	dir        string // short temp dir: sockets live below it
	bin        string // tools bin with the Kubernetes binaries
	kubeconfig string
	kubeletDir string // kubelet --root-dir
	pluginDir  string // the kubelet's device-plugins directory
	// kubeletArgs and stopKubelet restart the kubelet.
	kubeletArgs []string
	stopKubelet func()
	node        string
	cs          *kubernetes.Clientset
	logs        map[string]string // component -> log file
}

// devicePluginDir is where the kubelet serves device plugin registration.
const devicePluginDir = "/var/lib/kubelet/device-plugins"

// kubeBins are the binaries hack/build-tools.sh builds from
// tests/tools/kubernetes.
var kubeBins = []string{"etcd", "kube-apiserver", "kube-scheduler", "kubelet"}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// start runs a component in its own process group with its output in a
// log file, and stops it (SIGTERM, then SIGKILL) at cleanup or when the
// returned function is called.
func (c *cluster) start(t *testing.T, name string, args ...string) func() {
	t.Helper()
	logPath := filepath.Join(c.dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(c.bin, name)
	if name == "c8s-launcher" {
		root, _ := containerdtest.RepoRoot()
		bin = filepath.Join(root, "bin", name)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	c.logs[name] = logPath
	done := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(done) }()
	stop := func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// logTail returns the last n lines of a component's log.
func (c *cluster) logTail(name string, n int) string {
	data, err := os.ReadFile(c.logs[name])
	if err != nil {
		return fmt.Sprintf("(no %s log: %v)", name, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logGrep returns the lines of a component's log that contain any of words
// (at most the last n).
func (c *cluster) logGrep(name string, n int, words ...string) string {
	data, _ := os.ReadFile(c.logs[name])
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}

// kernelTunables are the sysctls the kubelet sets on start; the test puts
// the host's values back.
var kernelTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

func restoreSysctls(t *testing.T) {
	saved := map[string][]byte{}
	for _, k := range kernelTunables {
		if v, err := os.ReadFile("/proc/sys/" + k); err == nil {
			saved[k] = v
		}
	}
	t.Cleanup(func() {
		for k, v := range saved {
			if err := os.WriteFile("/proc/sys/"+k, v, 0o644); err != nil {
				t.Logf("restoring sysctl %s: %v", k, err)
			}
		}
	})
}

// clusterOptions add to the default cluster.
type clusterOptions struct {
	// controllers, when set, runs kube-controller-manager with these
	// controllers (for example deployment-controller,
	// replicaset-controller) and enables the ServiceAccount admission
	// plugin, which gives each pod the default service account's token
	// (the serviceaccount-controller creates the account, and
	// root-ca-certificate-publisher-controller the kube-root-ca.crt
	// ConfigMap the token's volume reads).
	controllers []string
}

// startCluster starts the control plane and a kubelet named node on the
// CRI socket of containerd at criSocket.
func startCluster(t *testing.T, dir, criSocket string) *cluster {
	t.Helper()
	return startClusterWith(t, dir, criSocket, clusterOptions{})
}

// startClusterWith is startCluster with the components o adds.
func startClusterWith(t *testing.T, dir, criSocket string, o clusterOptions) *cluster {
	t.Helper()
	c := &cluster{dir: dir, bin: containerdtest.ToolsBin(t), node: "c8s-e2e-node", logs: map[string]string{}}
	bins := kubeBins
	if len(o.controllers) > 0 {
		bins = append(slices.Clone(bins), "kube-controller-manager")
	}
	for _, b := range bins {
		if _, err := os.Stat(filepath.Join(c.bin, b)); err != nil {
			containerdtest.SkipOrFail(t, "%s not found in %s: run make tools", b, c.bin)
		}
	}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	etcdClient, etcdPeer := freePort(t), freePort(t)
	c.start(t, "etcd", "--name=default", "--data-dir="+filepath.Join(dir, "etcd"),
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", etcdClient),
		fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", etcdClient),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-cluster=default=http://127.0.0.1:%d", etcdPeer),
		"--unsafe-no-fsync")

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	saKey := write("sa.key", string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})))
	token := rand.Text()
	tokens := write("tokens.csv", token+`,admin,admin,"system:masters"`+"\n")
	apiPort := freePort(t)
	pki := filepath.Join(dir, "apiserver-pki")
	apiArgs := []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdClient),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir=" + pki, "--token-auth-file=" + tokens,
		"--authorization-mode=AlwaysAllow", "--allow-privileged=true",
		"--service-account-key-file=" + saKey, "--service-account-signing-key-file=" + saKey,
		"--service-account-issuer=https://kubernetes.default.svc", "--service-cluster-ip-range=10.96.0.0/24",
		"--endpoint-reconciler-type=none", "--kubelet-preferred-address-types=InternalIP",
	}
	if len(o.controllers) == 0 {
		// Without the serviceaccount controller there is no default
		// service account for the admission plugin to find.
		apiArgs = append(apiArgs, "--disable-admission-plugins=ServiceAccount")
	}
	c.start(t, "kube-apiserver", apiArgs...)

	c.kubeconfig = write("kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:%d
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
`, apiPort, token))
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	c.wait(t, "kube-apiserver ready", time.Minute, func(ctx context.Context) (bool, error) {
		_, err := c.cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil, nil
	}, func() string { return c.logTail("kube-apiserver", 30) + "\netcd:\n" + c.logTail("etcd", 10) })

	if len(o.controllers) > 0 {
		// The apiserver's self-signed serving certificate (written before
		// it turned ready) is the cluster's CA: root-ca-certificate-
		// publisher-controller puts it in each namespace's kube-root-ca.crt.
		c.start(t, "kube-controller-manager", "--kubeconfig="+c.kubeconfig, "--leader-elect=false",
			"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", freePort(t)),
			"--authentication-kubeconfig="+c.kubeconfig, "--authorization-kubeconfig="+c.kubeconfig,
			"--controllers="+strings.Join(o.controllers, ","),
			"--service-account-private-key-file="+saKey, "--root-ca-file="+filepath.Join(pki, "apiserver.crt"))
	}

	c.start(t, "kube-scheduler", "--kubeconfig="+c.kubeconfig, "--leader-elect=false",
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", freePort(t)),
		"--authentication-kubeconfig="+c.kubeconfig, "--authorization-kubeconfig="+c.kubeconfig)

	restoreSysctls(t)
	c.kubeletDir = filepath.Join(dir, "kubelet")
	kcfg := write("kubelet.yaml", fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%s
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
port: %d
healthzPort: 0
readOnlyPort: 0
podLogsDir: %s
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%", imagefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
`, criSocket, freePort(t), filepath.Join(dir, "pod-logs")))
	// The kubelet's device-plugin socket is fixed at
	// /var/lib/kubelet/device-plugins/kubelet.sock whatever --root-dir
	// says, so one such test runs on a host at a time; what it creates
	// there goes at cleanup.
	c.pluginDir = devicePluginDir
	if _, err := os.Stat("/var/lib/kubelet"); os.IsNotExist(err) {
		t.Cleanup(func() { os.RemoveAll("/var/lib/kubelet") })
	} else {
		t.Cleanup(func() {
			for _, n := range []string{"kubelet.sock", "kubelet_internal_checkpoint", "c8s-sim-slot.sock", "c8s-snp-asid.sock", "c8s-tdx-key.sock"} {
				os.Remove(filepath.Join(devicePluginDir, n))
			}
		})
	}
	c.kubeletArgs = []string{"--config=" + kcfg, "--kubeconfig=" + c.kubeconfig, "--root-dir=" + c.kubeletDir,
		"--cert-dir=" + filepath.Join(c.kubeletDir, "pki"), "--hostname-override=" + c.node, "--v=2"}
	c.stopKubelet = c.start(t, "kubelet", c.kubeletArgs...)
	t.Cleanup(func() { unmountBelow(t, c.kubeletDir) }) // after the kubelet stopped
	return c
}

// wait polls cond every second until it holds or limit passes; then it
// fails with what diag says.
func (c *cluster) wait(t *testing.T, what string, limit time.Duration, cond func(context.Context) (bool, error), diag func() string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %v (last error: %v)\n%s", what, limit, last, diag())
		case <-time.After(time.Second):
		}
	}
}

// unmountBelow lazily unmounts whatever the kubelet left mounted under dir.
func unmountBelow(t *testing.T, dir string) {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Logf("reading mounts under %s: %v", dir, err)
		return
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i].Mountpoint, unix.MNT_DETACH); err != nil {
			t.Logf("unmount %s: %v", mounts[i].Mountpoint, err)
		}
	}
}
