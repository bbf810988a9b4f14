package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/google/go-sev-guest/abi"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
	kbs "github.com/c8s-dev/c8s/launcher/broker"
)

// The processes of the test pods. In the agent-policy pod the sandbox
// listens on 8080, which its policy lets the host port-forward to, and on
// 9090, which it does not, and shows both in its log. In both pods the
// app holds the pod's secret, prints it and sleeps.
var (
	sandboxArgs       = []string{"sh", "-c", "httpd -p 8080 && httpd -p 9090 && netstat -ltn && exec sleep 3600"}
	appArgs           = []string{"sh", "-c", "cat /run/secrets/db-password && exec sleep 3600"}
	policySandboxArgs = []string{"sleep", "3600"}
	readerArgs        = []string{"sh", "-c", "cat /config/hello; if touch /config/sub/w 2>/dev/null; then echo wrote; else echo refused; fi"}
)

// tomlStrings writes a TOML array of strings.
func tomlStrings(vs ...string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = strconv.Quote(v)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// kbsInitData is the [kbs] section giving the pod the broker's secret.
func kbsInitData(b *broker) string {
	return fmt.Sprintf(`
[kbs]
url = "https://%s"
cert = '''
%s'''

[[kbs.secrets]]
resource = "kbs:///default/key/db-password"
path = "/run/secrets/db-password"
`, b.addr, b.certPEM)
}

// agentPolicyInitData is the measured init data of a pod without a
// [policy] section: no exec from the host, port-forward to 8080 only, no
// devices beyond the standard ones, and the broker's secret.
func agentPolicyInitData(b *broker) []byte {
	doc := `version = "0.1"

[agent_policy]
allow_exec = false
allow_port_forward = [8080]
` + kbsInitData(b)
	if _, err := initdata.Parse([]byte(doc)); err != nil {
		panic(err)
	}
	return []byte(doc)
}

// policyInitData is the measured init data of a pod under a [policy]
// naming its sandbox and containers app and reader exactly as sandboxSpec,
// containerSpec and testPolicyPod's readerSpec write them (in "/", as
// root): the host may
// exec only `echo allowed` in app, there and as that user, which alone
// gets the broker's secret, and may not read app's logs; reader has a
// host share (virtio-fs) on /config, read-only, and a tmpfs on /scratch,
// and its logs go to the host. extra adds rules (layeredRuleDoc).
func policyInitData(b *broker, extra string) []byte {
	doc := fmt.Sprintf(`version = "0.1"
%s
[policy.sandbox]
image = %q
args = %s
env = %s
working_dir = "/"
uid = 0
gid = 0

[policy.containers.app]
image = %q
args = %s
env = %s
working_dir = "/"
uid = 0
gid = 0
exec = [["echo", "allowed"]]
secrets = [{ resource = "kbs:///default/key/db-password" }]
mounts = [{ destination = "/cache", kind = "emptydir", volume = "cache" }]

[policy.containers.reader]
image = %q
args = %s
env = %s
working_dir = "/"
uid = 0
gid = 0
logs = true
mounts = [
  { destination = "/config", kind = "shared", read_only = true },
  { destination = "/scratch", kind = "tmpfs" },
]
%s`, kbsInitData(b), image, tomlStrings(policySandboxArgs...), tomlStrings(imagePath), image, tomlStrings(appArgs...), tomlStrings(imagePath),
		image, tomlStrings(readerArgs...), tomlStrings(imagePath), extra)
	if _, err := initdata.Parse([]byte(doc)); err != nil {
		panic(err)
	}
	return []byte(doc)
}

// forgedInitData is what the host would rather have the pod run under:
// exec and every port allowed, no broker.
var forgedInitData = []byte(`version = "0.1"

[agent_policy]
allow_exec = true
allow_port_forward = [8080, 9090]
`)

// TestMaliciousHost plays the host against real pod VMs, through the real
// agent channel, and tries the attacks a host that is the adversary (snp,
// tdx; here the sim TEE, with the same guest code paths) would try. Each
// must be refused by the guest, or by the owner's key broker, by name:
// the error class the agent returns and a message naming what was refused
// and the rule that refused it. Each attack changes one thing of a request
// that the guest accepts (the pod's own containers are created from the
// same specs), so that it fails if the check that refuses it is removed.
//
// Two VMs, because init data with a [policy] section cannot set
// agent_policy.allow_exec: AgentPolicyPod is the pod of agent_policy
// alone (allow_exec, allow_port_forward, allow_devices), PolicyPod the pod
// of a [policy] (exec allowlist, mounts, capabilities, image, args, env,
// logs), which the host also gives a virtio-fs share. Within each, the
// subtests run in order: attacks before the init data, the genuine init
// data, the pod's own containers, then the rest.
func TestMaliciousHost(t *testing.T) {
	h := newHostEnv(t)
	t.Run("AgentPolicyPod", func(t *testing.T) { testAgentPolicyPod(t, h) })
	t.Run("PolicyPod", func(t *testing.T) { testPolicyPod(t, h) })
}

func testAgentPolicyPod(t *testing.T, h *hostEnv) {
	c, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// This pod shows agent_policy alone, which a [policy] section cannot
	// carry (allow_exec), so it has none; the host could then create a
	// container of its own that gets the secret and read its output, and
	// the owner's broker would refuse the pod. Its broker is started with
	// the development escape hatch (AllowUnconfinedHost) so that the pod
	// gets its secret as before and HostKBSHandshake shows what stops the
	// host's own handshake: REPORT_DATA, after the pinned init data,
	// signature, measurement and HOST_DATA passed.
	var doc []byte
	b := startBroker(t, h.stateDir, h.imageDir, func(b *broker, kb *kbs.Broker) {
		doc = agentPolicyInitData(b)
		kb.InitData, kb.AllowUnconfinedHost = [][]byte{doc}, true
	})
	p := h.boot(t, c, "agent-policy-pod", doc, noVirtioFS, "sandbox", "app")
	ag, pf := p.sb.Agent, p.sb.PortForward()

	t.Run("BeforeInitData", func(t *testing.T) {
		// The host attests first, as the shim does: the agent takes
		// the launch digest from that evidence (it spares the create
		// reading its own), and the refusals below must still hold.
		if _, err := ag.GetEvidence(c, &agent.GetEvidenceRequest{Nonce: []byte("malicious host attests first")}); err != nil {
			t.Fatalf("GetEvidence: %v", err)
		}
		t.Run("CreateContainer", func(t *testing.T) {
			p.createRefused(t, c, "early", "early", sandboxSpec(sandboxArgs...), "sandbox",
				errdefs.ErrFailedPrecondition, `container "early" refused`, "SetInitData")
		})
		t.Run("ExecProcess", func(t *testing.T) {
			_, err := ag.ExecProcess(c, &agent.ExecProcessRequest{ContainerId: "sandbox", ExecId: "early", Process: processJSON(t, "id")})
			refused(t, err, errdefs.ErrFailedPrecondition, `exec "early" refused`, "SetInitData")
		})
		t.Run("UpdateContainer", func(t *testing.T) {
			_, err := ag.UpdateContainer(c, &agent.UpdateContainerRequest{ContainerId: "sandbox", Resources: []byte(`{"pids":{"limit":-1}}`)})
			refused(t, err, errdefs.ErrFailedPrecondition, `update of container "sandbox" refused`, "SetInitData")
		})
		t.Run("ListenPorts", func(t *testing.T) {
			_, err := pf.ListenPorts(c, &agent.ListenPortsRequest{})
			refused(t, err, errdefs.ErrFailedPrecondition, "ListenPorts refused", "SetInitData")
		})
		t.Run("Dial", func(t *testing.T) {
			_, err := pf.Dial(c, &agent.DialRequest{Port: 8080})
			refused(t, err, errdefs.ErrFailedPrecondition, "port-forward to port 8080 refused", "SetInitData")
		})
	})

	t.Run("ForgedInitData", func(t *testing.T) {
		launched, forged := initdata.Digest(doc), initdata.Digest(forgedInitData)
		_, err := ag.SetInitData(c, &agent.SetInitDataRequest{InitData: forgedInitData})
		refused(t, err, errdefs.ErrPermissionDenied, "HOST_DATA", hex.EncodeToString(launched[:]), hex.EncodeToString(forged[:]))
		// The policy is not loosened: none is in force, nothing is served.
		p.createRefused(t, c, "forged", "forged", sandboxSpec(sandboxArgs...), "sandbox", errdefs.ErrFailedPrecondition, `container "forged" refused`, "SetInitData")
		_, err = pf.Dial(c, &agent.DialRequest{Port: 9090})
		refused(t, err, errdefs.ErrFailedPrecondition, "SetInitData")
	})

	genuineInitData(t, c, p, b)

	if !t.Run("PodRuns", func(t *testing.T) {
		p.run(t, c, "sandbox", "sandbox", sandboxSpec(sandboxArgs...), "sandbox")
		out, err := readOutput(c, p.sb.IO, "sandbox", "", ":9090")
		if err != nil || !strings.Contains(out, ":8080") || !strings.Contains(out, ":9090") {
			t.Fatalf("the sandbox does not listen on 8080 and 9090 (%v):\n%s", err, out)
		}
		p.run(t, c, "app", "sandbox", containerSpec("app", true, appArgs...), "app")
	}) {
		t.FailNow()
	}

	t.Run("LayeredImage", func(t *testing.T) { testLayeredImage(t, c, h, p) })

	t.Run("ExecForbidden", func(t *testing.T) {
		_, err := ag.ExecProcess(c, &agent.ExecProcessRequest{ContainerId: "app", ExecId: "read-secret",
			Process: processJSON(t, "cat", "/run/secrets/db-password"), Stdio: &agent.Stdio{Stdout: true}})
		refused(t, err, errdefs.ErrPermissionDenied, `exec "read-secret" refused`, "agent_policy.allow_exec = false")
	})

	t.Run("PortForwardOutsideAllowlist", func(t *testing.T) {
		lp, err := pf.ListenPorts(c, &agent.ListenPortsRequest{})
		if err != nil {
			t.Fatal(errgrpc.ToNative(err))
		}
		if !slices.Equal(lp.Ports, []uint32{8080}) {
			t.Errorf("ListenPorts = %v: want [8080], the pod's 9090 hidden", lp.Ports)
		}
		_, err = pf.Dial(c, &agent.DialRequest{Port: 9090})
		refused(t, err, errdefs.ErrPermissionDenied, "port-forward to port 9090 refused", "agent_policy.allow_port_forward [8080]")
		// The allowed port is served: the refusal is the policy's.
		conn, err := pf.Dial(c, &agent.DialRequest{Port: 8080})
		if err != nil {
			t.Fatalf("port-forward to the allowed port 8080: %v", errgrpc.ToNative(err))
		}
		defer pf.Close(c, &agent.ConnCloseRequest{ConnId: conn.ConnId})
		if _, err := pf.Write(c, &agent.ConnWriteRequest{ConnId: conn.ConnId, Data: []byte("GET / HTTP/1.0\r\n\r\n")}); err != nil {
			t.Fatal(errgrpc.ToNative(err))
		}
		// A read gives what has arrived: the status line may come in parts.
		var got []byte
		for len(got) < len("HTTP/1.") {
			r, err := pf.Read(c, &agent.ConnReadRequest{ConnId: conn.ConnId})
			if err != nil {
				t.Fatalf("port 8080 answered %q, then %v: want the sandbox's httpd", got, errgrpc.ToNative(err))
			}
			got = append(got, r.Data...)
			if r.Eof {
				break
			}
		}
		if !bytes.HasPrefix(got, []byte("HTTP/1.")) {
			t.Fatalf("port 8080 answered %q: want the sandbox's httpd", got)
		}
	})

	t.Run("TEEDevice", func(t *testing.T) {
		// The app's own spec, given /dev/sev-guest as CRI gives a device.
		s := containerSpec("app", true, appArgs...)
		major, minor := int64(10), int64(124) // misc; sev-guest's minor is dynamic
		fm := os.FileMode(0o600)
		s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/sev-guest", Type: "c", Major: major, Minor: minor, FileMode: &fm}}
		s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rw"})
		p.createRefused(t, c, "attack-sev-guest", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			"device /dev/sev-guest (c 10:124) is refused", "the pod VM's own misc device", "never given to a container")
	})

	t.Run("HostKBSHandshake", func(t *testing.T) {
		released := strings.Count(b.Log(), "released")
		hs, err := runHostHandshake(c, b, ag, doc)
		if err != nil {
			t.Fatal(err)
		}
		// The broker checks the signature, the measurement and HOST_DATA
		// before REPORT_DATA: only REPORT_DATA stops it.
		hostRD := reportdata.Host(hs.binding[:])
		wantDetail := fmt.Sprintf("REPORT_DATA (nonce) mismatch: expected %x, got %x", hs.binding, hostRD)
		if hs.attest.status != http.StatusUnauthorized || hs.attest.info.Type != kbsapi.ErrorTypePrefix+"AttestationFailed" ||
			!strings.Contains(hs.attest.info.Detail, wantDetail) {
			t.Fatalf("the broker answered the host's attestation %d %s (then its resource request %d, %d bytes): want 401 AttestationFailed naming %q",
				hs.attest.status, hs.attest.body, hs.resource.status, len(hs.resource.body), wantDetail)
		}
		t.Logf("refused by the broker (%d %s): %s", hs.attest.status, hs.attest.info.Type, hs.attest.info.Detail)
		// The evidence was the pod's own, with its measured HOST_DATA, and
		// its REPORT_DATA the host domain's binding of the host's bytes.
		rep, err := abi.ReportToProto(hs.evidence.Report)
		if err != nil {
			t.Fatal(err)
		}
		if launched := initdata.Digest(doc); !bytes.Equal(rep.GetHostData(), launched[:]) {
			t.Errorf("the evidence's HOST_DATA %x is not the pod's %x", rep.GetHostData(), launched)
		}
		if !bytes.Equal(rep.GetReportData(), hostRD[:]) {
			t.Errorf("the evidence's REPORT_DATA is %x: want SHA-512(%q || 0 || the host's nonce) = %x", rep.GetReportData(), reportdata.HostDomain, hostRD)
		}
		if hs.resource.status != http.StatusUnauthorized || !strings.Contains(hs.resource.info.Detail, "has not attested") {
			t.Errorf("the broker answered the host's resource request %d %s: want 401, not attested", hs.resource.status, hs.resource.body)
		}
		if n := strings.Count(b.Log(), "released"); n != released {
			t.Errorf("the broker released a resource to the host:\n%s", b.Log())
		}
		if !strings.Contains(b.Log(), "kbs: attestation refused") {
			t.Errorf("the broker's log does not show the refusal:\n%s", b.Log())
		}
	})
}

// genuineInitData attests pod p and hands its agent the init data, as the
// shim does; the agent then fetches the pod's secret from broker b.
func genuineInitData(t *testing.T, c context.Context, p *hostPod, b *broker) {
	if !t.Run("GenuineInitData", func(t *testing.T) {
		v, err := p.sb.Attest(c, p.cfg)
		if err != nil {
			t.Fatalf("attest the pod: %v\nbroker:\n%s", err, b.Log())
		}
		if v.Provider != "sim" || v.SNP == nil {
			t.Fatalf("verified %+v: want sim SNP evidence", v)
		}
		if !strings.Contains(b.Log(), "released default/key/db-password") {
			t.Fatalf("the broker did not release the secret to the pod:\n%s", b.Log())
		}
	}) {
		t.FailNow()
	}
}

func testPolicyPod(t *testing.T, h *hostEnv) {
	c, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// The image of container "layered", which the policy pins by its
	// layers, and a valid layer of the host's own.
	ls := h.policyPodLayers(t)
	var doc []byte
	b := startBroker(t, h.stateDir, h.imageDir, func(b *broker, kb *kbs.Broker) {
		doc = policyInitData(b, layeredRuleDoc(ls.base, ls.app))
		// The harness builds the sandbox's, app's and reader's roots on
		// the host (their rules pin no layers), to attack them: the
		// owner's opt-out, so that the broker judges this pod on its
		// policy, which is what these attacks test.
		kb.InitData, kb.AllowHostRootfsPods = [][]byte{doc}, true
	})
	// The host offers the pod a share: a host directory with a file, on
	// virtio-fs.
	hostDir := filepath.Join(h.root, "host-config")
	if err := os.Mkdir(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostDir, "hello"), []byte("from the host's share\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// With a writable mount of the host's below it, which virtio-fs
	// announces: the policy requires /config read-only all the way down.
	sub := filepath.Join(hostDir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	p := h.boot(t, c, "policy-pod", doc, withVirtioFS, "sandbox", "app", "reader")
	p.shareHostPath(t, hostDir, "host-config", true)
	ag := p.sb.Agent

	genuineInitData(t, c, p, b)

	if !t.Run("PodRuns", func(t *testing.T) {
		p.run(t, c, "sandbox", "sandbox", sandboxSpec(policySandboxArgs...), "sandbox")
		p.run(t, c, "app", "sandbox", containerSpec("app", true, appArgs...), "app")
	}) {
		t.FailNow()
	}

	t.Run("ExecNotOnAllowlist", func(t *testing.T) {
		_, err := ag.ExecProcess(c, &agent.ExecProcessRequest{ContainerId: "app", ExecId: "shell",
			Process: processJSON(t, "cat", "/run/secrets/db-password"), Stdio: &agent.Stdio{Stdout: true}})
		refused(t, err, errdefs.ErrPermissionDenied, `ExecProcess "app" exec "shell"`,
			`process.args ["cat", "/run/secrets/db-password"]`, "policy.containers.app.exec", `["echo", "allowed"]`)
	})

	t.Run("ExecOnAllowlistRuns", func(t *testing.T) {
		// The control: what the list names runs, and its output reaches
		// the host.
		if _, err := ag.ExecProcess(c, &agent.ExecProcessRequest{ContainerId: "app", ExecId: "echo",
			Process: processJSON(t, "echo", "allowed"), Stdio: &agent.Stdio{Stdout: true}}); err != nil {
			t.Fatalf("exec on the allowlist: %v", errgrpc.ToNative(err))
		}
		out, err := readOutput(c, p.sb.IO, "app", "echo", "allowed\n")
		if err != nil || out != "allowed\n" {
			t.Fatalf("the allowed exec printed %q (%v)", out, err)
		}
		if w, err := ag.WaitProcess(c, &agent.ProcessRequest{ContainerId: "app", ExecId: "echo"}); err != nil || w.ExitStatus != 0 {
			t.Fatalf("the allowed exec: %v, %v", w, errgrpc.ToNative(err))
		}
	})

	t.Run("ExecElsewhere", func(t *testing.T) {
		// The allowed argv, started in another directory (where its
		// relative paths would find what the host put there) or as
		// another user.
		for name, proc := range map[string]specs.Process{
			"cwd":  {Args: []string{"echo", "allowed"}, Env: []string{imagePath}, Cwd: "/tmp"},
			"user": {Args: []string{"echo", "allowed"}, Env: []string{imagePath}, Cwd: "/", User: specs.User{UID: 1000, GID: 1000}},
		} {
			raw, err := json.Marshal(proc)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ag.ExecProcess(c, &agent.ExecProcessRequest{ContainerId: "app", ExecId: "elsewhere-" + name, Process: raw, Stdio: &agent.Stdio{Stdout: true}})
			if name == "cwd" {
				refused(t, err, errdefs.ErrPermissionDenied, `process.cwd "/tmp"`, "policy.containers.app.exec_working_dir", "the container's working directory")
			} else {
				refused(t, err, errdefs.ErrPermissionDenied, "process.user.uid 1000", "policy.containers.app.exec_uid")
			}
		}
	})

	t.Run("ExecAmbientCapabilities", func(t *testing.T) {
		// The allowed argv with an ambient set: crun would raise it at
		// exec, for a user that is not root too.
		nb := []string{"CAP_NET_BIND_SERVICE"}
		raw, err := json.Marshal(specs.Process{Args: []string{"echo", "allowed"}, Env: []string{imagePath}, Cwd: "/",
			Capabilities: &specs.LinuxCapabilities{Bounding: nb, Effective: nb, Permitted: nb, Ambient: nb}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ag.ExecProcess(c, &agent.ExecProcessRequest{ContainerId: "app", ExecId: "ambient", Process: raw, Stdio: &agent.Stdio{Stdout: true}})
		refused(t, err, errdefs.ErrPermissionDenied, `process.capabilities.ambient ["CAP_NET_BIND_SERVICE"]`, "never allowed")
	})

	t.Run("ChangedWorkingDir", func(t *testing.T) {
		s := containerSpec("app", true, appArgs...)
		s.Process.Cwd = "/tmp"
		p.createRefused(t, c, "attack-cwd", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			`process.cwd "/tmp"`, "policy.containers.app.working_dir")
	})

	t.Run("UnnamedContainer", func(t *testing.T) {
		p.createRefused(t, c, "attack-debug", "sandbox", containerSpec("debug", true, appArgs...), "app", errdefs.ErrPermissionDenied,
			`io.kubernetes.cri.container-name "debug"`, "no rule names this container", "policy.containers")
	})

	bind := func(source, dest string) *specs.Spec {
		s := containerSpec("app", true, appArgs...)
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dest, Type: "bind", Source: source, Options: []string{"rbind", "ro"}})
		return s
	}
	t.Run("BindSecrets", func(t *testing.T) {
		p.createRefused(t, c, "attack-bind-secrets", "sandbox", bind("/run/c8s/secrets", "/stolen"), "app", errdefs.ErrPermissionDenied,
			`.source "/run/c8s/secrets"`, "policy.containers.app.mounts", "guest-internal")
	})
	t.Run("BindGuestRoot", func(t *testing.T) {
		p.createRefused(t, c, "attack-bind-root", "sandbox", bind("/", "/guest"), "app", errdefs.ErrPermissionDenied,
			`.source "/"`, "policy.containers.app.mounts", "guest-internal")
	})

	t.Run("Privileged", func(t *testing.T) {
		// As containerd writes a privileged container (without the host's
		// devices): every capability, nothing masked, sysfs and cgroupfs
		// writable.
		s := containerSpec("app", true, appArgs...)
		all := policyapi.AllCapabilities
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: all, Effective: all, Permitted: all}
		s.Linux.MaskedPaths, s.Linux.ReadonlyPaths = nil, nil
		for i, m := range s.Mounts {
			if m.Destination == "/sys" || m.Destination == "/sys/fs/cgroup" {
				s.Mounts[i].Options = slices.DeleteFunc(slices.Clone(m.Options), func(o string) bool { return o == "ro" })
			}
		}
		p.createRefused(t, c, "attack-privileged", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			"process.capabilities.bounding", "CAP_SYS_ADMIN", "linux.maskedPaths", "linux.readonlyPaths", "needs a privileged container")
	})

	t.Run("CapSysPtrace", func(t *testing.T) {
		s := containerSpec("app", true, appArgs...)
		cs := s.Process.Capabilities
		cs.Bounding, cs.Effective, cs.Permitted = append(cs.Bounding, "CAP_SYS_PTRACE"), append(cs.Effective, "CAP_SYS_PTRACE"), append(cs.Permitted, "CAP_SYS_PTRACE")
		p.createRefused(t, c, "attack-ptrace", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			`process.capabilities.bounding ["CAP_SYS_PTRACE"]`, "policy.containers.app.capabilities")
	})

	t.Run("VMPidNamespace", func(t *testing.T) {
		// hostPID: no pid namespace of its own, the VM's, where the agent
		// and every container's processes are.
		s := containerSpec("app", true, appArgs...)
		s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.PIDNamespace })
		p.createRefused(t, c, "attack-hostpid", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			"linux.namespaces.pid", "the VM's", "policy.containers.app.vm_namespaces")
	})

	t.Run("OtherImage", func(t *testing.T) {
		s := containerSpec("app", true, appArgs...)
		s.Annotations["io.kubernetes.cri.image-name"] = "docker.io/attacker/busybox:latest"
		p.createRefused(t, c, "attack-image", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			`image "docker.io/attacker/busybox:latest"`, "policy.containers.app.image", strconv.Quote(image))
	})

	t.Run("ChangedArgs", func(t *testing.T) {
		s := containerSpec("app", true, "sh", "-c", "cat /run/secrets/db-password > /dev/console")
		p.createRefused(t, c, "attack-args", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			"process.args", "> /dev/console", "policy.containers.app.args")
	})

	t.Run("ChangedEnv", func(t *testing.T) {
		s := containerSpec("app", true, appArgs...)
		s.Process.Env = append(s.Process.Env, "LD_PRELOAD=/tmp/spy.so")
		p.createRefused(t, c, "attack-env", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			`process.env[1] "LD_PRELOAD=/tmp/spy.so"`, "policy.containers.app.env")
	})

	testPolicyPodMore(t, c, p)

	// reader's spec as the guest accepts it (VirtioFSNamed): hostDir bound
	// on /config, which the host shares over virtio-fs, and a tmpfs on
	// /scratch. Each attack moves the share to one other destination.
	scratch := len(containerSpec("reader", true).Mounts) // its index in reader's spec
	config := scratch + 1
	readerSpec := func(scratchMount, configMount specs.Mount) *specs.Spec {
		s := containerSpec("reader", true, readerArgs...)
		s.Mounts = append(s.Mounts, scratchMount, configMount)
		return s
	}
	shareOn := func(dest string) specs.Mount {
		return specs.Mount{Destination: dest, Type: "bind", Source: hostDir, Options: []string{"rbind", "ro"}}
	}
	scratchTmpfs := specs.Mount{Destination: "/scratch", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}}

	t.Run("VirtioFSNotNamed", func(t *testing.T) {
		// The host's directory, through the share, where the policy names
		// no mount: the host would put files of its choosing in the
		// container (a config, a binary on its PATH) and read what it
		// writes there.
		p.createRefused(t, c, "attack-share", "sandbox", readerSpec(scratchTmpfs, shareOn("/stolen")), "reader", errdefs.ErrPermissionDenied,
			fmt.Sprintf(`mounts[%d] "/stolen" (shared)`, config), "policy.containers.reader.mounts")
	})

	t.Run("VirtioFSOverTmpfs", func(t *testing.T) {
		// The share in place of the tmpfs the policy names on /scratch:
		// the destination is allowed, but as guest memory, not as host
		// content.
		p.createRefused(t, c, "attack-share-tmpfs", "sandbox", readerSpec(shareOn("/scratch"), shareOn("/config")), "reader", errdefs.ErrPermissionDenied,
			fmt.Sprintf(`mounts[%d] "/scratch" (shared)`, scratch), "policy.containers.reader.mounts", "/scratch (tmpfs)")
	})

	t.Run("GuestBindIntoShare", func(t *testing.T) {
		// A guest bind through the share's writable submount: had the
		// agent looked whether the source exists, the look would have
		// mounted the submount, writable, in its namespace, for the
		// share's next stage to carry into reader's read-only /config.
		s := readerSpec(scratchTmpfs, shareOn("/config"))
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/walk", Type: "bind", Source: "/run/c8s/shared/host-config/sub/x", Options: []string{"rbind", "ro"}})
		p.createRefused(t, c, "attack-walk", "sandbox", s, "reader", errdefs.ErrPermissionDenied,
			`.source "/run/c8s/shared/host-config/sub/x"`, "policy.containers.reader.mounts", "guest-internal")
	})

	t.Run("VirtioFSNamed", func(t *testing.T) {
		// The control: the share where the policy names one is served,
		// and the container reads the host's file through it; the host's
		// writable mount below it is read-only there too.
		p.run(t, c, "reader", "sandbox", readerSpec(scratchTmpfs, shareOn("/config")), "reader")
		const want = "from the host's share\nrefused\n"
		out, err := readOutput(c, p.sb.IO, "reader", "", want)
		if err != nil || out != want {
			t.Fatalf("reader printed %q (%v): want the host's file, and its submount read-only", out, err)
		}
		if _, err := os.Stat(filepath.Join(sub, "w")); err == nil {
			t.Error("reader wrote to the host's mount below its read-only volume")
		}
		if w, err := ag.WaitProcess(c, &agent.ProcessRequest{ContainerId: "reader"}); err != nil || w.ExitStatus != 0 {
			t.Fatalf("reader: %v, %v", w, errgrpc.ToNative(err))
		}
	})

	t.Run("NoLogsStdout", func(t *testing.T) {
		// The app printed the secret; its rule has no logs = true.
		_, err := p.sb.IO.ReadStdout(c, &agent.ReadStreamRequest{ContainerId: "app"})
		refused(t, err, errdefs.ErrPermissionDenied, `ReadStdout "app"`, "stdout", "policy.containers.app.logs")
		_, err = p.sb.IO.ReadStderr(c, &agent.ReadStreamRequest{ContainerId: "app"})
		refused(t, err, errdefs.ErrPermissionDenied, `ReadStderr "app"`, "stderr", "policy.containers.app.logs")
	})

	testPinnedLayers(t, c, h, p, ls)
}
