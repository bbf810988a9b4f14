package agent

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/policy"
)

// The pod's measured policy, through the agent: each test plays a
// malicious host against a real agent (over ttrpc, with runc where a
// container must run) and fails if the agent's check is removed.

// policyDoc is init data with one broker secret and a [policy] for
// containers named app, quiet and other, CRI-annotated (podSpec).
func policyDoc(t *testing.T, extra string) []byte {
	t.Helper()
	srv := httptest.NewTLSServer(nil)
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	srv.Close()
	return fmt.Appendf(nil, `version = "0.1"
[kbs]
url = "https://127.0.0.1:1"
cert = '''
%s'''
[[kbs.secrets]]
resource = "kbs:///default/key/db"
path = "/run/secrets/db"

[policy]
stats = false
update_resources = false
%s
[policy.containers.app]
image = "example/app:1"
args = ["sh", "-c", "re:.*"]
env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"]
working_dir = "/"
uid = 0
gid = 0
logs = true
exec = [["echo", "allowed"]]
secrets = [{ resource = "kbs:///default/key/db", path = "/etc/c8s-file" }]

[policy.containers.quiet]
image = "example/app:1"
args = ["sh", "-c", "re:.*"]
env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"]
working_dir = "/"
uid = 0
gid = 0
%s`, cert, extra, shRule("other", ""))
}

// shRule is a [policy] rule for containers named name that run sh -c
// anything as root in the test image, with their logs, and extra.
func shRule(name, extra string) string {
	return fmt.Sprintf(`
[policy.containers.%s]
image = "example/app:1"
args = ["sh", "-c", "re:.*"]
env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"]
working_dir = "/"
uid = 0
gid = 0
logs = true
%s`, name, extra)
}

// enforce puts doc in force as a malicious host must: through SetInitData,
// matching the launch digest. The pod's secret is in place already (as
// if fetched from its broker): "db-secret".
func (e *env) enforce(t *testing.T, doc []byte) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "0")
	if err := os.WriteFile(file, []byte("db-secret\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	calls := 0
	e.svc.mu.Lock()
	e.svc.secrets = []secretMount{{resource: "kbs:///default/key/db", source: file, destination: "/run/secrets/db"}}
	e.svc.cfg.Evidence = snpEvidence(initdata.Digest(doc), &calls)
	e.svc.mu.Unlock()
	if _, err := e.agent.SetInitData(ctxT(t), &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatal(err)
	}
}

// podSpec is the base spec of a CRI container named name running sh -c
// script.
func (e *env) podSpec(t *testing.T, name, script string) specs.Spec {
	s := e.spec(t, "sh", "-c", script)
	s.Annotations = map[string]string{policy.AnnotationContainerType: "container", policy.AnnotationContainerName: name, policy.AnnotationImageName: "example/app:1"}
	return s
}

// refused creates a container the policy must refuse, and checks that the
// denial names field and that nothing of the container is left.
func (e *env) refused(t *testing.T, s specs.Spec, field string) {
	t.Helper()
	_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, s), Rootfs: rootfsReq(), Stdio: pipes()})
	assertCode(t, err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), field) {
		t.Errorf("error %v does not name %s", err, field)
	}
	e.assertGone(t, "evil")
}

// TestMaliciousHostCreateUnderPolicy: containers the policy does not
// allow are refused before anything of them is carried out.
func TestMaliciousHostCreateUnderPolicy(t *testing.T) {
	e := newEnv(t)
	e.enforce(t, policyDoc(t, ""))
	if err := os.MkdirAll(e.svc.cfg.SecretsDir, 0o700); err != nil {
		t.Fatal(err)
	}

	// A second container binding the secrets directory, or /.
	for _, src := range []string{e.svc.cfg.SecretsDir, "/"} {
		s := e.podSpec(t, "other", "true")
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/mnt", Type: "bind", Source: src, Options: []string{"rbind", "ro"}})
		e.refused(t, s, fmt.Sprintf("mounts[%d].source %q", len(s.Mounts)-1, src))
	}
	// Another image; other args; a privileged container; CAP_SYS_PTRACE;
	// the TEE guest device; the VM's pid namespace; a name the policy
	// does not have.
	s := e.podSpec(t, "app", "true")
	s.Annotations[policy.AnnotationImageName] = "attacker/app:1"
	e.refused(t, s, `image "attacker/app:1"`)
	s = e.podSpec(t, "app", "true")
	s.Process.Args = []string{"cat", "/etc/c8s-file"}
	e.refused(t, s, "process.args")
	s = e.podSpec(t, "app", "true")
	s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN", "CAP_SYS_PTRACE")
	s.Linux.MaskedPaths = nil
	e.refused(t, s, "process.capabilities.bounding")
	s = e.podSpec(t, "app", "true")
	s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: "/dev/sev-guest", Type: "c", Major: 10, Minor: 124})
	e.refused(t, s, "device /dev/sev-guest (c 10:124) is refused") // by allow_devices, under any init data
	s = e.podSpec(t, "app", "true")
	s.Linux.Namespaces = s.Linux.Namespaces[1:] // pid first, in runc's spec
	e.refused(t, s, "linux.namespaces.pid")
	s = e.podSpec(t, "debugger", "true")
	e.refused(t, s, `io.kubernetes.cri.container-name "debugger"`)
	// A terminal the pod spec does not give app (its rule has no tty):
	// the host's stdin would be typed input, ^C a SIGINT.
	_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, e.podSpec(t, "app", "true")), Rootfs: rootfsReq(),
		Stdio: &agentapi.Stdio{Terminal: true, Stdin: true, Stdout: true}})
	assertCode(t, err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), "stdio.terminal") || !strings.Contains(err.Error(), "policy.containers.app.tty") {
		t.Errorf("a terminal app's rule does not allow: %v", err)
	}
	e.assertGone(t, "evil")

	// What the policy allows runs; its secret is where the rule says.
	if out := e.run(t, "c1", e.podSpec(t, "app", "cat /etc/c8s-file")); out != "db-secret\n" {
		t.Errorf("app's stdout = %q, want its secret", out)
	}
}

// TestSecretsOnlyWhereNamed: a container the policy gives no secret does
// not get it, though today's default mounts every secret everywhere.
func TestSecretsOnlyWhereNamed(t *testing.T) {
	e := newEnv(t)
	e.enforce(t, policyDoc(t, ""))
	if out := e.run(t, "o1", e.podSpec(t, "other", "cat /etc/c8s-file; ls /run/secrets 2>&1")); !strings.HasPrefix(out, "image content\n") || strings.Contains(out, "db") {
		t.Errorf("other's stdout = %q: it saw the pod's secret", out)
	}
}

// TestMaliciousHostExecUnderPolicy: exec runs only argv on the
// container's list.
func TestMaliciousHostExecUnderPolicy(t *testing.T) {
	e := newEnv(t)
	e.enforce(t, policyDoc(t, ""))
	e.create(t, "c2", e.podSpec(t, "app", "sleep 100000"), pipes(), nil)
	e.start(t, "c2")
	_, err := e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{ContainerId: "c2", ExecId: "e1", Process: e.process("cat", "/etc/c8s-file"), Stdio: pipes()})
	assertCode(t, err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), `process.args ["cat", "/etc/c8s-file"]`) || !strings.Contains(err.Error(), "policy.containers.app.exec") {
		t.Errorf("exec of cat: %v", err)
	}
	if _, err := e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{ContainerId: "c2", ExecId: "e2", Process: e.process("echo", "allowed"), Stdio: pipes()}); err != nil {
		t.Fatal(err)
	}
	if out := e.readAll(t, "c2", "e2", false); out != "allowed\n" {
		t.Errorf("exec stdout = %q", out)
	}
	e.wait(t, "c2", "e2")
	// The allowed argv in another directory (one the host writes, where
	// its relative paths would find the host's files): refused.
	p := e.baseProc
	p.Args, p.Cwd = []string{"echo", "allowed"}, "/tmp"
	_, err = e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{ContainerId: "c2", ExecId: "e3", Process: mustJSON(t, p), Stdio: pipes()})
	assertCode(t, err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), `process.cwd "/tmp"`) || !strings.Contains(err.Error(), "policy.containers.app.exec_working_dir") {
		t.Errorf("exec in /tmp: %v", err)
	}
	// Without a cwd or a user, the exec gets the container's, and runs.
	p.Cwd = ""
	var raw map[string]any
	if err := json.Unmarshal(mustJSON(t, p), &raw); err != nil {
		t.Fatal(err)
	}
	delete(raw, "user")
	if _, err := e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{ContainerId: "c2", ExecId: "e4", Process: mustJSON(t, raw), Stdio: pipes()}); err != nil {
		t.Fatalf("exec without cwd and user: %v", err)
	}
	if out := e.readAll(t, "c2", "e4", false); out != "allowed\n" {
		t.Errorf("exec stdout = %q", out)
	}
	e.wait(t, "c2", "e4")
	// Stdin is the container's rule's: none.
	_, err = e.io.WriteStdin(ctxT(t), &agentapi.WriteStdinRequest{ContainerId: "c2", Data: []byte("x")})
	assertCode(t, err, codes.PermissionDenied)
	// Signals: those that stop it, nothing else.
	_, err = e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "c2", Signal: 10})
	assertCode(t, err, codes.PermissionDenied)
	// Stats and updates are off in this policy, and so is the list of
	// pids (VM-wide numbers whose turnover shows activity).
	_, err = e.agent.Stats(ctxT(t), &agentapi.StatsRequest{ContainerId: "c2"})
	assertCode(t, err, codes.PermissionDenied)
	_, err = e.agent.ListPids(ctxT(t), &agentapi.ListPidsRequest{ContainerId: "c2"})
	assertCode(t, err, codes.PermissionDenied)
	_, err = e.agent.UpdateContainer(ctxT(t), &agentapi.UpdateContainerRequest{ContainerId: "c2", Resources: []byte(`{"pids":{"limit":100}}`)})
	assertCode(t, err, codes.PermissionDenied)
	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "c2", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	e.wait(t, "c2", "")
	e.remove(t, "c2")
}

// TestMaliciousHostReadsNoLogsContainer: the output of a container without
// logs never reaches the host, and the guest drains it, so the container
// does not block on output nobody may read.
func TestMaliciousHostReadsNoLogsContainer(t *testing.T) {
	e := newEnv(t)
	e.enforce(t, policyDoc(t, ""))
	// Well over the agent's buffer: it would block if the guest kept it.
	e.create(t, "q1", e.podSpec(t, "quiet", "i=0; while [ $i -lt 3000 ]; do echo 0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789; i=$((i+1)); done; echo secret >&2"), pipes(), nil)
	e.start(t, "q1")
	for _, read := range []func(context.Context, *agentapi.ReadStreamRequest) (*agentapi.ReadStreamResponse, error){e.io.ReadStdout, e.io.ReadStderr} {
		_, err := read(ctxT(t), &agentapi.ReadStreamRequest{ContainerId: "q1"})
		assertCode(t, err, codes.PermissionDenied)
		if err == nil || !strings.Contains(err.Error(), "policy.containers.quiet.logs") {
			t.Errorf("read: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Second)
	defer cancel()
	resp, err := e.agent.WaitProcess(ctx, &agentapi.ProcessRequest{ContainerId: "q1"})
	if err != nil || resp.GetExitStatus() != 0 {
		t.Fatalf("the no-logs container did not finish (blocked on its output?): %v, %v", resp, err)
	}
	e.remove(t, "q1")
}

// TestAuditModeLogsDenials: with policy.audit the agent carries out what
// it would refuse, and still gives secrets only where named.
func TestAuditModeLogsDenials(t *testing.T) {
	e := newEnv(t)
	e.enforce(t, policyDoc(t, "audit = true"))
	s := e.podSpec(t, "nobody-named", "cat /etc/c8s-file")
	if out := e.run(t, "a1", s); out != "image content\n" {
		t.Errorf("stdout = %q: want the container run, without the secret", out)
	}
}

// The IO, signal, stats and update checks, without runc: a container the
// policy created, driven by a host asking for what its rule forbids.
func TestPolicyChecksWithoutRunc(t *testing.T) {
	doc := policyDoc(t, "")
	svc := snpService(t, doc)
	svc.secrets = []secretMount{{resource: "kbs:///default/key/db", source: "/x", destination: "/run/secrets/db"}}
	// Reads of a stream with nothing in it would block: a missing check
	// fails the test on time.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{
		Annotations: map[string]string{policy.AnnotationContainerType: "container", policy.AnnotationContainerName: "quiet", policy.AnnotationImageName: "example/app:1"},
		Process:     &specs.Process{Args: []string{"sh", "-c", "x"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"}, Cwd: "/"},
		Linux:       &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}}, MaskedPaths: policyapi.DefaultMaskedPaths, ReadonlyPaths: policyapi.DefaultReadonlyPaths},
	}
	grant, err := svc.evaluator().CreateContainer(&policy.CreateContainer{ID: "q", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if m := svc.secretMounts(grant); len(m) != 0 {
		t.Fatalf("a container without secrets in its rule gets %+v", m)
	}
	p := &process{done: make(chan struct{}), stdout: newStream(), stderr: newStream(), stdin: &stdin{}}
	p.stdout.append([]byte("leak"))
	svc.containers["q"] = &container{id: "q", init: p, execs: map[string]*process{}, grant: grant}

	for name, call := range map[string]func() error{
		"ReadStdout": func() error {
			_, err := svc.ReadStdout(ctx, &agentapi.ReadStreamRequest{ContainerId: "q"})
			return err
		},
		"ReadStderr": func() error {
			_, err := svc.ReadStderr(ctx, &agentapi.ReadStreamRequest{ContainerId: "q"})
			return err
		},
		"WriteStdin": func() error {
			_, err := svc.WriteStdin(ctx, &agentapi.WriteStdinRequest{ContainerId: "q", Data: []byte("x")})
			return err
		},
		"SignalProcess": func() error {
			_, err := svc.SignalProcess(ctx, &agentapi.SignalProcessRequest{ContainerId: "q", Signal: 10})
			return err
		},
		"Stats": func() error {
			_, err := svc.Stats(ctx, &agentapi.StatsRequest{ContainerId: "q"})
			return err
		},
		"UpdateContainer": func() error {
			_, err := svc.UpdateContainer(ctx, &agentapi.UpdateContainerRequest{ContainerId: "q", Resources: []byte(`{}`)})
			return err
		},
		"ListPids": func() error {
			_, err := svc.ListPids(ctx, &agentapi.ListPidsRequest{ContainerId: "q"})
			return err
		},
		"ResizePty": func() error {
			_, err := svc.ResizePty(ctx, &agentapi.ResizePtyRequest{ContainerId: "q", Width: 1, Height: 1})
			return err
		},
		"ExecProcess": func() error {
			p.done = make(chan struct{}) // running
			_, err := svc.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "q", ExecId: "e", Process: []byte(`{"args":["sh"]}`)})
			return err
		},
	} {
		err := call()
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "policy: "+name+` "quiet"`) {
			t.Errorf("%s: %v, want a policy denial", name, err)
		}
	}
}

// TestMaliciousHostSharedSymlink: the host writes the virtio-fs share; an
// entry that is a symlink would have runc bind the guest path it names
// (the secrets) where the policy allows a shared volume.
func TestMaliciousHostSharedSymlink(t *testing.T) {
	dir := t.TempDir()
	svc := &Service{cfg: Config{SharedDir: dir, MountShared: func(tag, target string) error { return nil }}}
	if err := os.Symlink("/run/c8s/secrets", filepath.Join(dir, "c-0")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "c-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	bundle := t.TempDir()
	req := &agentapi.CreateContainerRequest{ContainerId: "c", SharedMounts: []*agentapi.SharedMount{{Source: "/var/lib/kubelet/pods/x/volumes/cm", Name: "c-0"}}}
	if _, err := svc.sharedMounts(req, bundle); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("a symlink on the share: %v, want permission denied", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("staging a share entry needs root (open_tree, move_mount)")
	}
	req.SharedMounts[0].Name = "c-1"
	t.Cleanup(func() { _ = unmountAll(bundle) })
	if paths, err := svc.sharedMounts(req, bundle); err != nil || paths["/var/lib/kubelet/pods/x/volumes/cm"] != filepath.Join(bundle, "shares", "c-1") {
		t.Fatalf("a directory on the share: %v, %v", paths, err)
	}
}

func TestHasUser(t *testing.T) {
	for raw, want := range map[string]bool{
		`{"args":["x"],"user":{"uid":0,"gid":0}}`: true,
		`{"args":["x"],"user":{}}`:                true,
		`{"args":["x"]}`:                          false,
		`{"args":["x"],"user":null}`:              false,
		`not json`:                                false,
	} {
		if got := hasUser([]byte(raw)); got != want {
			t.Errorf("hasUser(%s) = %v, want %v", raw, got, want)
		}
	}
}
