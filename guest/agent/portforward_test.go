package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/policy"
)

// procNetTCP is /proc/net/tcp as a little-endian guest prints it: a
// listener on 0.0.0.0:80, one on 127.0.0.1:8080, one on 10.0.0.127:9000
// (not reachable from the loopback), an established connection from
// :8080, and a listener on 10.0.0.2:443.
const procNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 7F00000A:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
   3: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4 1 0 100 0 0 10 0
   4: 0200000A:01BB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5 1 0 100 0 0 10 0
`

// procNetTCP6: a listener on [::]:5432, one on [::1]:6379, one on
// ::ffff:127.0.0.1:7000, and one on a global address (2001:db8::1):8443.
const procNetTCP6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1538 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 00000000000000000000000001000000:18EB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:1B58 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
   3: B80D0120000000000000000001000000:20FB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0 100 0 0 10 0
`

func fakeProc(t *testing.T, tcp, tcp6 string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"tcp": tcp, "tcp6": tcp6} {
		if err := os.WriteFile(filepath.Join(dir, "net", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestListeningPorts(t *testing.T) {
	got, err := listeningPorts(fakeProc(t, procNetTCP, procNetTCP6), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint32{80, 5432, 6379, 7000, 8080}
	if !slices.Equal(got, want) {
		t.Fatalf("listening ports = %v, want %v (wildcard and loopback listeners only, each once)", got, want)
	}
	if _, err := parseListening(strings.NewReader("h\n 0: 0100007F:zz 0:0 0A\n")); err == nil {
		t.Fatal("a malformed port parsed")
	}
}

// withPolicy is an agent whose measured init data is doc (SetInitData
// already accepted it), reading sockets from procDir.
func withPolicy(t *testing.T, doc, procDir string) *Service {
	t.Helper()
	d, err := initdata.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{ProcDir: procDir}, containers: map[string]*container{}, policy: d.Agent, policySet: true}
	s.forward = newPortForward(s)
	return s
}

// echoServer listens on the loopback and echoes each connection back
// until its client half-closes.
func echoServer(t *testing.T) uint32 {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return uint32(l.Addr().(*net.TCPAddr).Port)
}

// A pod without init data lets the host forward to its ports: the relay
// carries bytes both ways and the half-close reaches the pod.
func TestPortForwardRelay(t *testing.T) {
	ctx := context.Background()
	port := echoServer(t)
	s := withPolicy(t, "", fakeProc(t, procNetTCP, procNetTCP6))
	d, err := s.forward.Dial(ctx, &agentapi.DialRequest{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.forward.Write(ctx, &agentapi.ConnWriteRequest{ConnId: d.ConnId, Data: []byte("ping")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.forward.Close(ctx, &agentapi.ConnCloseRequest{ConnId: d.ConnId, WriteOnly: true}); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for {
		r, err := s.forward.Read(ctx, &agentapi.ConnReadRequest{ConnId: d.ConnId})
		if err != nil {
			t.Fatal(err)
		}
		if r.Eof {
			break
		}
		got = append(got, r.Data...)
	}
	if string(got) != "ping" {
		t.Fatalf("relayed %q, want the echo %q", got, "ping")
	}
	if _, err := s.forward.Close(ctx, &agentapi.ConnCloseRequest{ConnId: d.ConnId}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.forward.Read(ctx, &agentapi.ConnReadRequest{ConnId: d.ConnId}); !errdefs.IsNotFound(err) {
		t.Fatalf("read after close: %v, want not found", err)
	}
	ports, err := s.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ports.Ports, []uint32{80, 5432, 6379, 7000, 8080}) {
		t.Fatalf("ListenPorts without init data = %v, want every loopback-reachable port", ports.Ports)
	}
	if _, err := s.forward.Dial(ctx, &agentapi.DialRequest{Port: 70000}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("dial port 70000: %v, want invalid argument", err)
	}
}

// Port-forward is a channel the host opens into the pod: a pod whose
// measured policy does not list a port must refuse it, and must not even
// tell the host which ports it listens on.
func TestMaliciousHostPortForward(t *testing.T) {
	ctx := context.Background()
	port := echoServer(t)
	proc := fakeProc(t, procNetTCP, procNetTCP6)

	none := withPolicy(t, "version = \"0.1\"\n", proc)
	if _, err := none.forward.Dial(ctx, &agentapi.DialRequest{Port: port}); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "allow_port_forward") {
		t.Fatalf("dial under a policy without allow_port_forward: %v, want permission denied naming allow_port_forward", err)
	}
	if _, err := none.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{}); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("ListenPorts under a policy without allow_port_forward: %v, want permission denied", err)
	}

	some := withPolicy(t, fmt.Sprintf("version = \"0.1\"\n[agent_policy]\nallow_port_forward = [8080, %d]\n", port), proc)
	if _, err := some.forward.Dial(ctx, &agentapi.DialRequest{Port: 5432}); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "port 5432") {
		t.Fatalf("dial to an unlisted port: %v, want permission denied naming the port", err)
	}
	if _, err := some.forward.Dial(ctx, &agentapi.DialRequest{Port: port}); err != nil {
		t.Fatalf("dial to a listed port: %v", err)
	}
	ports, err := some.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ports.Ports, []uint32{8080}) {
		t.Fatalf("ListenPorts = %v, want only the listed ports the pod listens on, [8080]", ports.Ports)
	}

	// Before the measured init data is in force, nothing is forwarded.
	calls := 0
	doc := []byte("version = \"0.1\"\n[agent_policy]\nallow_port_forward = [80]\n")
	early := &Service{cfg: Config{ProcDir: proc, Evidence: snpEvidence(initdata.Digest(doc), &calls)}, containers: map[string]*container{}}
	early.forward = newPortForward(early)
	if _, err := early.forward.Dial(ctx, &agentapi.DialRequest{Port: 80}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("dial before SetInitData: %v, want failed precondition", err)
	}
	if _, err := early.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("ListenPorts before SetInitData: %v, want failed precondition", err)
	}

	if _, err := initdata.Parse([]byte("version = \"0.1\"\n[agent_policy]\nallow_port_forward = [0]\n")); err == nil || !strings.Contains(err.Error(), "allow_port_forward[0]") {
		t.Fatalf("port 0 in the policy: %v, want an error naming it", err)
	}
}

// ListenPorts with the set the host knows waits for a change, and
// returns it as soon as it happens.
func TestListenPortsWaitsForChange(t *testing.T) {
	ctx := context.Background()
	proc := fakeProc(t, procNetTCP, "")
	s := withPolicy(t, "", proc)
	start := time.Now()
	r, err := s.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{Known: []uint32{80, 8080}, KnownSet: true, WaitMs: 300})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 300*time.Millisecond || !slices.Equal(r.Ports, []uint32{80, 8080}) {
		t.Fatalf("unchanged set: returned %v after %v, want [80 8080] after the 300 ms wait", r.Ports, time.Since(start))
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(proc, "net", "tcp"), []byte(strings.SplitAfterN(procNetTCP, "\n", 3)[0]+strings.SplitAfterN(procNetTCP, "\n", 3)[1]), 0o644)
	}()
	r, err = s.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{Known: []uint32{80, 8080}, KnownSet: true, WaitMs: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Ports, []uint32{80}) {
		t.Fatalf("after port 8080 closed: %v, want [80]", r.Ports)
	}
}

// The pod's ports are those of its sandbox container's network namespace,
// which has the pod's interfaces and which its containers join, not the
// agent's.
func TestListenPortsInThePodNamespace(t *testing.T) {
	ctx := context.Background()
	proc := fakeProc(t, procNetTCP, "")
	podNet := filepath.Join(proc, "4242", "net")
	if err := os.MkdirAll(podNet, 0o755); err != nil {
		t.Fatal(err)
	}
	pod := strings.SplitAfterN(procNetTCP, "\n", 3)
	if err := os.WriteFile(filepath.Join(podNet, "tcp"), []byte(pod[0]+pod[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	s := withPolicy(t, "", proc)
	s.containers["other"] = &container{id: "other", sandboxID: "sb", init: &process{pid: 7}}
	r, err := s.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Ports, []uint32{80, 8080}) {
		t.Fatalf("without a sandbox container: %v, want the agent's namespace's [80 8080]", r.Ports)
	}
	s.containers["sb"] = &container{id: "sb", sandboxID: "sb", init: &process{pid: 4242}}
	if r, err = s.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Ports, []uint32{80}) {
		t.Fatalf("with the sandbox container (pid 4242): %v, want its namespace's [80]", r.Ports)
	}
}

// A host cannot exhaust the guest's sockets and memory with port-forward
// connections: past maxForwardConns open ones, Dial is refused, before it
// connects.
func TestPortForwardConnectionLimit(t *testing.T) {
	ctx := context.Background()
	port, accepted := silentServer(t)
	s := withPolicy(t, "", fakeProc(t, procNetTCP, ""))
	first, err := s.forward.Dial(ctx, &agentapi.DialRequest{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	c := s.forward.conns[first.ConnId]
	for i := uint64(1); len(s.forward.conns) < maxForwardConns; i++ {
		s.forward.conns[first.ConnId+i] = c
	}
	if _, err := s.forward.Dial(ctx, &agentapi.DialRequest{Port: port}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("dial past %d open connections: %v, want resource exhausted", maxForwardConns, err)
	}
	if len(s.forward.conns) != maxForwardConns {
		t.Fatalf("%d connections recorded, want %d", len(s.forward.conns), maxForwardConns)
	}
	// Refused before it connects: the pod's service never sees it.
	time.Sleep(100 * time.Millisecond)
	if n := accepted.Load(); n != 1 {
		t.Errorf("the pod's service accepted %d connections, want only the first", n)
	}
}

// Under a [policy] the pod's network namespace is that of the sandbox the
// policy admitted: not the VM's own when none runs, and not that of a
// container the host merely calls the sandbox (its id as sandbox id).
func TestMaliciousHostPortForwardWithoutPolicySandbox(t *testing.T) {
	ctx := context.Background()
	port := echoServer(t)
	proc := fakeProc(t, procNetTCP, "")
	podNet := filepath.Join(proc, "4242", "net")
	if err := os.MkdirAll(podNet, 0o755); err != nil {
		t.Fatal(err)
	}
	pod := strings.SplitAfterN(procNetTCP, "\n", 3)
	if err := os.WriteFile(filepath.Join(podNet, "tcp"), []byte(pod[0]+pod[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := initdata.Parse([]byte(`
[policy]
[policy.sandbox]
image = "pause:1"
args = ["/pause"]
working_dir = "/"
uid = 65535
gid = 65535
`))
	if err != nil {
		t.Fatal(err)
	}
	s := withPolicy(t, "", proc)
	s.eval = policy.New(d.Policy, nil)

	refused := func(what string) {
		t.Helper()
		if _, err := s.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{}); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("ListenPorts %s: %v, want failed precondition", what, err)
		}
		if _, err := s.forward.Dial(ctx, &agentapi.DialRequest{Port: port}); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("Dial %s: %v, want failed precondition, not the VM's namespace", what, err)
		}
	}
	refused("with no sandbox")
	// A container the host names as its own sandbox, not admitted by
	// policy.sandbox.
	s.containers["fake"] = &container{id: "fake", sandboxID: "fake", init: &process{pid: 4242}}
	refused("with a container the policy did not admit as the sandbox")

	spec := &specs.Spec{
		Annotations: map[string]string{policy.AnnotationContainerType: policy.ContainerTypeSandbox, policy.AnnotationSandboxImageName: "pause:1"},
		Process:     &specs.Process{Args: []string{"/pause"}, Cwd: "/", User: specs.User{UID: 65535, GID: 65535}},
		Linux:       &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}}, MaskedPaths: policyapi.DefaultMaskedPaths, ReadonlyPaths: policyapi.DefaultReadonlyPaths},
	}
	grant, err := s.eval.CreateContainer(&policy.CreateContainer{ID: "pod", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	s.containers["pod"] = &container{id: "pod", sandboxID: "pod", init: &process{pid: 4242}, grant: grant}
	delete(s.containers, "fake")
	r, err := s.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{})
	if err != nil || !slices.Equal(r.Ports, []uint32{80}) {
		t.Fatalf("with the admitted sandbox (pid 4242): %v, %v; want its namespace's [80]", r, err)
	}
}
