package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/launcher/attest"
	kbs "github.com/c8s-dev/c8s/launcher/broker"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

// The mesh tests' network: a bridge and subnet of their own.
const (
	meshBridge  = "c8se2emesh0"
	meshSubnet  = "10.231.9.0/24"
	meshGateway = "10.231.9.1"
	// meshHandler is a c8s runtime that passes the io.c8s.* pod
	// annotations (the init data) through, as packaging's does.
	meshHandler = "c8s-mesh"
	meshTD      = "c8s.test"
)

// Debian's static busybox wget crashes with -T (a timeout): the
// commands rely on ExecSync's timeout instead.
//
// The workload: the server writes a page whose text is computed in the
// container (so that it appears in no request, spec or init data) and
// serves it on every address, port 8080, as it would without a mesh; the
// client fetches it from the server pod's IP. Neither knows of the
// proxies: the agents redirect the meshed port to them.
var (
	meshPage       = "c8s-mesh-42-plaintext-marker"
	meshServerArgs = meshBenchServer()
	meshClientArgs = []string{"sleep", "3600"}
	meshCatCert    = []string{"cat", meshapi.Dir + "/" + meshapi.CertFile}
	meshGetArg     = `re:http://10\.231\.9\.[0-9]+:8080/marker\.html`
)

// meshGet is the client's fetch of the server pod's page, straight from
// its IP and meshed port.
func meshGet(serverIP string) []string {
	return []string{"busybox", "wget", "-q", "-O", "-", "http://" + serverIP + ":8080/marker.html"}
}

// criSandboxSysctls are the sysctls containerd's CRI sets on a pod
// sandbox.
var criSandboxSysctls = []string{"net.ipv4.ip_unprivileged_port_start=0", "net.ipv4.ping_group_range=0 2147483647"}

func meshID(sa string) string { return meshapi.IdentityURI(meshTD, "default", sa) }

// meshEnv is a CRI containerd with the CNI bridge, and the owner's mesh
// CA on the bridge's gateway.
type meshEnv struct {
	e      *meshCRI
	ca     *kbs.MeshCA
	base   func(*kbs.ResourcePolicy) *kbs.Broker // the verification settings with a policy
	url    string
	tlsPEM []byte
	caPEM  []byte
	log    *broker // the CA's log
	dir    string
}

func newMeshEnv(t *testing.T, lifetime time.Duration) *meshEnv {
	t.Helper()
	cniBin, cniConf := bridgeNetwork(t, meshBridge, meshSubnet, meshGateway)
	m := &meshEnv{dir: t.TempDir(), log: &broker{}}
	m.e = setupCRIWithRuntime(t, cniBin, cniConf)

	// The owner's CA: its TLS endpoint on every address (the bridge
	// appears with the first pod), certified for the gateway's.
	spDir := statedir.SimSP(m.e.meshState)
	if _, err := sim.Open(spDir); err != nil {
		t.Fatal(err)
	}
	trust, err := attest.SimTrust(spDir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := attest.NewVerifier(trust)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := kbs.LoadReferenceValues(filepath.Join(m.e.imageDir, manifest.FileName), "sim", nil)
	if err != nil {
		t.Fatal(err)
	}
	m.base = func(p *kbs.ResourcePolicy) *kbs.Broker {
		return &kbs.Broker{Verifier: v, References: []kbs.Reference{ref}, ResourcePolicy: p}
	}
	certPEM, keyPEM, err := kbs.NewMeshCAKey(meshTD, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := kbs.ParseMeshCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	m.caPEM = certPEM
	m.ca = kbs.NewMeshCA(m.base(nil), cert, key)
	m.ca.Lifetime = lifetime
	tlsCert, tlsKey, err := kbs.SelfSigned([]string{meshGateway}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(tlsCert, tlsKey)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp4", "0.0.0.0:0", &tls.Config{Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	m.tlsPEM = tlsCert
	m.url = fmt.Sprintf("https://%s:%d", meshGateway, l.Addr().(*net.TCPAddr).Port)
	logger := logrus.New()
	logger.SetOutput(m.log)
	logCtx := log.WithLogger(context.Background(), logrus.NewEntry(logger))
	srv := &http.Server{Handler: m.ca, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return logCtx }}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return m
}

// setupCRIWithRuntime is setupCRIWith, with the CNI network and the
// meshHandler runtime, which passes the io.c8s.* pod annotations (the
// pods' init data) to the shim, as packaging's runtimes do. It has a c8s
// config and state dir of its own (meshEnv.e.meshState).
func setupCRIWithRuntime(t *testing.T, cniBin, cniConf string) *meshCRI {
	t.Helper()
	root, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	imageDir := filepath.Join(root, "_output", "image")
	// A short directory: the pod VMs' sockets live below it.
	dir, err := os.MkdirTemp("", "c8s-mesh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	state := filepath.Join(dir, "c8s")
	config := filepath.Join(dir, "c8s.toml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("[hypervisor]\nkernel = %q\ninitrd = %q\n[runtime]\nstate_dir = %q\n",
		filepath.Join(imageDir, "vmlinuz"), filepath.Join(imageDir, "initrd.img"), state)), 0o644); err != nil {
		t.Fatal(err)
	}
	e := setupCRIWith(t, fmt.Sprintf(`
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [%q]
  conf_dir = %q
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%s]
  runtime_type = 'io.containerd.c8s.v2'
  pod_annotations = ['io.c8s.*']
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%s.options]
    ConfigPath = %q
`, cniBin, cniConf, meshHandler, meshHandler, config))
	return &meshCRI{env: e, meshState: state}
}

// meshCRI is the CRI env and the mesh runtime's state dir.
type meshCRI struct {
	*env
	meshState string
}

// guestLog is what the pod VMs' consoles logged of the mesh.
func (m *meshEnv) guestLog() string {
	logs, _ := filepath.Glob(filepath.Join(m.e.meshState, "*", "*", "console.log"))
	var b strings.Builder
	for _, f := range logs {
		data, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "mesh") {
				fmt.Fprintf(&b, "%s: %s\n", filepath.Base(filepath.Dir(f)), line)
			}
		}
	}
	return b.String()
}

// setPolicy gives the CA the owner's resource policy: which init data
// digest is which workload, which workload holds which identity.
func (m *meshEnv) setPolicy(t *testing.T, workloads map[string][]byte, identities map[string]string) {
	t.Helper()
	var doc strings.Builder
	for name, init := range workloads {
		d := initdata.Digest(init)
		// The pods' rules pin no layers (CRI pulls the images on the
		// node): the owner accepts the node's root file systems here.
		fmt.Fprintf(&doc, "[workloads.%s]\ntee = [\"sim\"]\ninit_data = [%q]\nallow_host_rootfs = true\n\n", name, hex.EncodeToString(d[:]))
	}
	fmt.Fprintf(&doc, "[mesh]\ntrust_domain = %q\n", meshTD)
	for sa, w := range identities {
		fmt.Fprintf(&doc, "\n[[mesh.identities]]\nnamespace = \"default\"\nservice_account = %q\nworkloads = [%q]\n", sa, w)
	}
	p, err := kbs.ParseResourcePolicy([]byte(doc.String()), false, m.dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, doc.String())
	}
	m.ca.SetBroker(m.base(p))
}

// initData is a pod's measured init data: an enforced [policy] for the
// CRI sandbox and container name with args and the host's execs, each
// pinning the test image's layer (the mesh CA refuses a rule without), and
// [mesh] with identity sa and extra (inbound / outbound tables).
func (m *meshEnv) initData(name string, args []string, execs [][]string, sa, extra string) []byte {
	var ex []string
	for _, e := range execs {
		ex = append(ex, tomlStrings(e...))
	}
	doc := fmt.Sprintf(`version = "0.1"

[policy.sandbox]
image = %q
args = %s
env = %s
working_dir = "/"
uid = 0
gid = 0
sysctls = %s
%s
[policy.containers.%s]
image = %q
args = %s
env = [%q, "re:HOSTNAME=.*"]
working_dir = "/"
uid = 0
gid = 0
logs = true
exec = [%s]
%s
[mesh]
url = %q
cert = '''
%s'''
ca = '''
%s'''
identity = %q
containers = [%q]
%s`, pauseImage, tomlStrings(pauseCmd...), tomlStrings(imagePath), tomlStrings(criSandboxSysctls...), testImageLayers(), name, image, tomlStrings(args...), imagePath,
		strings.Join(ex, ", "), testImageLayers(), m.url, m.tlsPEM, m.caPEM, meshID(sa), name, extra)
	if _, err := initdata.Parse([]byte(doc)); err != nil {
		panic(fmt.Sprintf("%v\n%s", err, doc))
	}
	return []byte(doc)
}

// meshPod is a CRI pod of the mesh runtime with one container.
type meshPod struct {
	*criPod
	ip  string
	ctr string
}

// run runs a pod with init data doc and its container.
func (m *meshEnv) run(ctx context.Context, t *testing.T, name, ctr string, doc []byte, args []string) *meshPod {
	t.Helper()
	cfg := &cri.PodSandboxConfig{
		Metadata:    &cri.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
		Hostname:    name,
		Annotations: map[string]string{initdata.Annotation: base64.StdEncoding.EncodeToString(doc)},
	}
	p := &criPod{e: m.e.env, ctx: ctx, cfg: cfg}
	p.connect(t)
	resp, err := p.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: meshHandler})
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v\ncontainerd log:\n%s", name, err, m.e.d.Log())
	}
	p.id = resp.PodSandboxId
	t.Cleanup(func() {
		p.rt.StopPodSandbox(context.Background(), &cri.StopPodSandboxRequest{PodSandboxId: p.id})
		p.rt.RemovePodSandbox(context.Background(), &cri.RemovePodSandboxRequest{PodSandboxId: p.id})
	})
	st, err := p.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: p.id})
	if err != nil {
		t.Fatal(err)
	}
	mp := &meshPod{criPod: p, ip: st.GetStatus().GetNetwork().GetIp()}
	if net.ParseIP(mp.ip) == nil {
		t.Fatalf("pod %s has no IP: %q", name, mp.ip)
	}
	mp.ctr = p.start(t, &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: ctr},
		Image:    &cri.ImageSpec{Image: image},
		Command:  args,
		// As the kubelet passes them: the runtime's defaults.
		Linux: &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{
			MaskedPaths: policyapi.DefaultMaskedPaths, ReadonlyPaths: policyapi.DefaultReadonlyPaths,
			// Its own PID namespace, as the kubelet asks for a pod that does
			// not share its process namespace (CRI's zero value is POD).
			NamespaceOptions: &cri.NamespaceOption{Pid: cri.NamespaceMode_CONTAINER},
		}},
	})
	return mp
}

// exec runs argv in the pod's container: stdout, and an error for a
// non-zero exit.
func (p *meshPod) exec(ctx context.Context, argv ...string) (string, error) {
	res, err := p.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: p.ctr, Cmd: argv, Timeout: 60})
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return string(res.Stdout), fmt.Errorf("%v: exit %d: %s", argv, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout), nil
}

// certSerial is the serial of the pod's mesh certificate as its
// container reads it ("" without one).
func (p *meshPod) certSerial(ctx context.Context) string {
	out, err := p.exec(ctx, meshCatCert...)
	if err != nil {
		return ""
	}
	blk, _ := pem.Decode([]byte(out))
	if blk == nil {
		return ""
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return ""
	}
	return c.SerialNumber.Text(16)
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last: %s)", what, d, state)
		}
		time.Sleep(time.Second)
	}
}

// TestMesh runs two pods of the owner's mesh on the CNI bridge, and a
// third the owner did not admit. The mesh is transparent: the client
// pod's workload fetches a page from the server pod's IP and port 8080,
// where the server's workload listens on every address, as without a
// mesh; the agents' redirects carry it through their proxies in mutual
// TLS, and the host, reading every frame of its network namespace, sees
// TLS records only. The host is refused on the meshed port, in plaintext
// and in TLS without a mesh certificate, while the unmeshed port 8081
// answers it; the unadmitted pod gets no certificate and cannot connect,
// and, refusing traffic outside the mesh, cannot reach the unmeshed port
// either.
// Certificates renew (a 45 s lifetime), and the client, withdrawn from
// the owner's policy, loses its certificate at its next renewal and can
// no longer connect.
func TestMesh(t *testing.T) {
	m := newMeshEnv(t, 45*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	serverDoc := m.initData("server", meshServerArgs, [][]string{meshCatCert}, "server", `
[[mesh.inbound]]
port = 8080
allow = [`+fmt.Sprintf("%q", meshID("client"))+`]
`)
	unknown := []byte("version = \"0.1\"\n# the client, before it exists\n")
	m.setPolicy(t, map[string][]byte{"server": serverDoc, "client": unknown}, map[string]string{"server": "server", "client": "client"})
	server := m.run(ctx, t, "server", "server", serverDoc, meshServerArgs)
	t.Logf("server pod %s", server.ip)
	eventually(t, 2*time.Minute, "the server's certificate", func() (bool, string) {
		s := server.certSerial(ctx)
		return s != "", m.log.Log()
	})

	clientExecs := append([][]string{meshCatCert, {"busybox", "wget", "-q", "-O", "-", meshGetArg}}, meshBenchExecs...)
	outbound := fmt.Sprintf(`
[[mesh.outbound]]
port = 8080
peers = [%q]
identity = %q
`, meshSubnet, meshID("server"))
	clientDoc := m.initData("client", meshClientArgs, clientExecs, "client", outbound)
	// The rogue pod asks for the client's identity, with the same policy
	// and ports, from init data the owner never pinned. It also refuses
	// traffic outside the mesh (unmeshed = "refuse").
	rogueDoc := m.initData("client", meshClientArgs, clientExecs, "client", "unmeshed = \"refuse\"\n"+outbound+"# not the owner's document\n")
	m.setPolicy(t, map[string][]byte{"server": serverDoc, "client": clientDoc}, map[string]string{"server": "server", "client": "client"})

	sniff := startSniffer(t, net.ParseIP(server.ip), 8080)
	client := m.run(ctx, t, "client", "client", clientDoc, meshClientArgs)
	t.Logf("client pod %s", client.ip)

	// Two pods talk through the mesh, the client dialling the server
	// pod's IP and port as it would without one.
	get := meshGet(server.ip)
	eventually(t, 2*time.Minute, "the client reaching the server pod's IP through the mesh", func() (bool, string) {
		out, err := client.exec(ctx, get...)
		return err == nil && strings.TrimSpace(out) == meshPage, fmt.Sprintf("%q %v\nCA log:\n%s\nguests:\n%s", out, err, m.log.Log(), m.guestLog())
	})

	// The host saw TLS only: a ClientHello to the server and application
	// data records both ways, never the page or the request.
	time.Sleep(time.Second)
	segs := sniff.segments()
	var hello, toServer, fromServer bool
	for _, s := range segs {
		if s.src.Equal(net.ParseIP(client.ip)) && s.dport == 8080 && len(s.data) > 5 && s.data[0] == 0x16 && s.data[1] == 0x03 && s.data[5] == 0x01 {
			hello = true
		}
		if len(s.data) > 3 && s.data[0] == 0x17 && s.data[1] == 0x03 && s.data[2] == 0x03 {
			if s.dport == 8080 {
				toServer = true
			} else {
				fromServer = true
			}
		}
	}
	if !hello || !toServer || !fromServer {
		t.Fatalf("captured %d segments on %s:8080: ClientHello %v, application data to the server %v, from it %v", len(segs), server.ip, hello, toServer, fromServer)
	}
	for _, plain := range [][]byte{[]byte(meshPage), []byte("GET /marker.html"), []byte("HTTP/1.")} {
		if sniff.contains(plain) {
			t.Fatalf("the host read %q on the wire", plain)
		}
	}
	t.Logf("the host captured %d segments on %s:8080, TLS records only", len(segs), server.ip)

	// A non-mesh client, the host, is refused on the meshed port: in
	// plaintext (which the capture does see: it would see the page), and
	// in TLS without a mesh certificate. The server's unmeshed port
	// answers it: the refusal is the mesh's, not the network's.
	probe := "GET /probe-c8s-mesh-host HTTP/1.0\r\n\r\n"
	if got := plainExchange(t, server.ip+":8080", probe); strings.Contains(got, "HTTP/") {
		t.Fatalf("the meshed port answered the host in plaintext: %q", got)
	}
	time.Sleep(500 * time.Millisecond)
	if !sniff.contains([]byte("/probe-c8s-mesh-host")) {
		t.Fatal("the capture does not see plaintext on the meshed port: it proves nothing")
	}
	if got, err := tlsExchange(server.ip+":8080", probe); err == nil || strings.Contains(got, meshPage) {
		t.Fatalf("the meshed port answered a TLS client without a mesh certificate: %q, %v", got, err)
	}
	if got := plainExchange(t, server.ip+":8081", "GET /marker.html HTTP/1.0\r\n\r\n"); !strings.Contains(got, meshPage) {
		t.Fatalf("the unmeshed port 8081 did not answer the host: %q", got)
	}

	// A pod the owner did not admit gets no certificate, and cannot
	// connect: its own proxy has nothing to present.
	rogue := m.run(ctx, t, "rogue", "client", rogueDoc, meshClientArgs)
	eventually(t, time.Minute, "the CA refusing the rogue pod", func() (bool, string) {
		return strings.Contains(m.log.Log(), "is not a document the broker pins"), m.log.Log()
	})
	if s := rogue.certSerial(ctx); s != "" {
		t.Fatalf("the rogue pod has certificate %s", s)
	}
	if out, err := rogue.exec(ctx, get...); err == nil || strings.Contains(out, meshPage) {
		t.Fatalf("the rogue pod reached the server's meshed port: %q", out)
	}
	// Its agent reached the CA through its refusing filter (the CA's
	// refusal above), but its workload's plaintext to the server's
	// unmeshed port, which the client reaches (the bench below), is
	// dropped: nothing answers within ExecSync's timeout.
	if out, err := rogue.exec(ctx, meshBenchBig(server.ip+":8081")...); err == nil && strings.TrimSpace(out) == strconv.Itoa(meshBenchMiB<<20) {
		t.Fatal("a pod with unmeshed = \"refuse\" fetched from an unmeshed port")
	}

	// What the mesh costs (hack/bench-mesh.sh prints it).
	meshBench(ctx, t, client, server.ip)

	// Renewal: a new certificate before the first expires, through a
	// fresh attestation, and the mesh still works on it.
	first := client.certSerial(ctx)
	eventually(t, 90*time.Second, "the client's certificate renewed", func() (bool, string) {
		s := client.certSerial(ctx)
		return s != "" && s != first, s
	})
	if out, err := client.exec(ctx, get...); err != nil || strings.TrimSpace(out) != meshPage {
		t.Fatalf("after renewal: %q, %v", out, err)
	}
	t.Logf("the client's certificate %s was renewed through a fresh attestation; the mesh works on its successor %s", first, client.certSerial(ctx))
	if n := strings.Count(m.log.Log(), "mesh CA: issued"); n < 3 {
		t.Fatalf("the CA issued %d certificates, want the renewals too:\n%s", n, m.log.Log())
	}

	// The owner withdraws the client's identity: its next renewal is
	// refused, it loses the certificate and the mesh refuses it.
	m.setPolicy(t, map[string][]byte{"server": serverDoc, "client": clientDoc}, map[string]string{"server": "server"})
	eventually(t, 90*time.Second, "the withdrawn client losing its certificate", func() (bool, string) {
		s := client.certSerial(ctx)
		return s == "", s
	})
	if out, err := client.exec(ctx, get...); err == nil || strings.Contains(out, meshPage) {
		t.Fatalf("the withdrawn client still reached the server: %q", out)
	}
	t.Log("withdrawn from the owner's policy, the client lost its certificate at its next renewal and the mesh refuses it")
}

// plainExchange sends req in plaintext to addr and returns what came back.
func plainExchange(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c, req)
	b, _ := io.ReadAll(c)
	return string(b)
}

// tlsExchange sends req in TLS (no client certificate) and returns the
// answer.
func tlsExchange(addr, req string) (string, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	_, err = io.Copy(&buf, c)
	return buf.String(), err
}
