package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/ociruntime"
	"github.com/c8s-dev/c8s/guest/policy"
)

// slowExecRuntime stands in for the OCI runtime: create starts a sleeping
// process and records the container's CRI name; exec waits for the test's
// go-ahead (the host stalling the guest between the agent's checks and the
// runtime reading its state) and records which container the id named
// when the runtime read it.
const slowExecRuntime = `#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in --root) ROOT=$2; shift 2;; --log|--log-format) shift 2;; *) break;; esac; done
cmd=$1; shift
for a; do id=$a; done
case $cmd in
create)
  while [ $# -gt 1 ]; do case "$1" in --bundle) B=$2; shift 2;; --pid-file) P=$2; shift 2;; *) shift;; esac; done
  mkdir -p "$ROOT/$id"
  grep -o '"io.kubernetes.cri.container-name":"[^"]*"' "$B/config.json" > "$ROOT/$id/name"
  echo '{}' > "$ROOT/$id/state.json"
  if [ -e "$ROOT/create-fail" ]; then rm "$ROOT/create-fail"; exit 1; fi
  sleep 1000 </dev/null >/dev/null 2>&1 &
  printf %s $! > "$P"; echo $! > "$ROOT/$id/pid" ;;
exec)
  while [ $# -gt 1 ]; do case "$1" in --pid-file) P=$2; shift 2;; *) shift;; esac; done
  touch "$ROOT/exec-waiting"
  while [ ! -e "$ROOT/exec-go" ]; do sleep 0.01; done
  echo "exec in $id: $(cat "$ROOT/$id/name" 2>/dev/null || echo none)" >> "$ROOT/exec.log"
  sleep 0 </dev/null >/dev/null 2>&1 &
  printf %s $! > "$P" ;;
delete)
  if [ -e "$ROOT/delete-hold" ]; then touch "$ROOT/delete-waiting"; while [ ! -e "$ROOT/delete-go" ]; do sleep 0.01; done; fi
  kill -9 "$(cat "$ROOT/$id/pid" 2>/dev/null)" 2>/dev/null; rm -rf "$ROOT/$id" ;;
esac
`

// TestMaliciousHostExecRacesRemoveAndRecreate: the policy allows an exec
// in container x as "app" (exec = echo allowed). While the OCI runtime is
// being started for it, the host removes x and creates x again as "quiet",
// whose rule allows no exec. The runtime finds the container by its id:
// the exec would run in "quiet" under the decision made for "app". The
// removal must wait for the exec, and the id stay taken until the runtime
// has deleted the container.
// slowHarness is an agent under a policy (policyDoc) whose OCI runtime is
// slowExecRuntime, rooted at root.
type slowHarness struct {
	svc  *Service
	root string
}

func newSlowHarness(t *testing.T) *slowHarness {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the agent holds the container's namespaces: needs root")
	}
	base := t.TempDir()
	root := filepath.Join(base, "runtime")
	script := filepath.Join(base, "runtime.sh")
	if err := os.WriteFile(script, []byte(slowExecRuntime), 0o755); err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{
		StateDir:      filepath.Join(base, "state"),
		CgroupsParent: fmt.Sprintf("/c8s-removal-%d", time.Now().UnixNano()),
		Runtime:       &ociruntime.Runtime{Command: script, Root: root, Reaper: testReaper},
		MountRootfs:   func(context.Context, *agentapi.Rootfs, string) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	doc := policyDoc(t, "")
	calls := 0
	svc.secrets = []secretMount{{resource: "kbs:///default/key/db", source: filepath.Join(base, "db"), destination: "/run/secrets/db"}}
	svc.cfg.Evidence = snpEvidence(initdata.Digest(doc), &calls)
	if _, err := svc.SetInitData(ctxT(t), &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return &slowHarness{svc: svc, root: root}
}

// create creates container id as the policy's container name.
func (h *slowHarness) create(t *testing.T, id, name string) error {
	_, err := h.svc.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: id, Rootfs: rootfsReq(), Stdio: pipes(), Spec: mustJSON(t, specs.Spec{
		Version:     "1.0.2",
		Annotations: map[string]string{policy.AnnotationContainerType: "container", policy.AnnotationContainerName: name, policy.AnnotationImageName: "example/app:1"},
		Process:     &specs.Process{Args: []string{"sh", "-c", "sleep 1000"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"}, Cwd: "/"},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			MaskedPaths: policyapi.DefaultMaskedPaths, ReadonlyPaths: policyapi.DefaultReadonlyPaths},
	})})
	return err
}

// touch creates the runtime's control file name.
func (h *slowHarness) touch(t *testing.T, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.root, name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// await waits for the runtime's file name to appear.
func (h *slowHarness) await(t *testing.T, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !fileExists(filepath.Join(h.root, name)); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the runtime never made %s", name)
		}
	}
}

func TestMaliciousHostExecRacesRemoveAndRecreate(t *testing.T) {
	h := newSlowHarness(t)
	svc, root, ctx := h.svc, h.root, ctxT(t)
	create := func(name string) error { return h.create(t, "x", name) }
	echo := mustJSON(t, specs.Process{Args: []string{"echo", "allowed"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"}, Cwd: "/"})
	exec := func(id string) error {
		_, err := svc.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "x", ExecId: id, Process: echo, Stdio: pipes()})
		return err
	}

	if err := create("app"); err != nil {
		t.Fatal(err)
	}
	execDone := make(chan error, 1)
	go func() { execDone <- exec("e1") }()
	for !fileExists(filepath.Join(root, "exec-waiting")) {
		select {
		case err := <-execDone:
			t.Fatalf("the exec in app returned before it reached the runtime: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	// The exec is past every check of the agent. The host removes x and
	// creates it again as "quiet".
	removed := make(chan error, 1)
	go func() {
		_, err := svc.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{ContainerId: "x"})
		removed <- err
	}()
	select {
	case err := <-removed:
		t.Errorf("RemoveContainer returned (%v) while an exec in the container was still being started", err)
		if err := create("quiet"); err != nil {
			t.Logf("create x as quiet: %v", err)
		}
	case <-time.After(300 * time.Millisecond):
		// Again and again: a refused create must not tidy up the x
		// being removed either.
		for range 3 {
			if err := create("quiet"); !errdefs.IsAlreadyExists(err) {
				t.Errorf("create x again while the old x is being removed: %v, want already exists", err)
			}
		}
	}
	h.touch(t, "exec-go")
	err := <-execDone
	log, _ := os.ReadFile(filepath.Join(root, "exec.log"))
	if strings.Contains(string(log), `"quiet"`) {
		t.Fatalf("the exec the policy allowed in app ran in quiet, whose rule allows no exec (exec: %v; runtime: %s)", err, log)
	}
	if err := <-removed; err != nil && !t.Failed() {
		t.Fatalf("remove x: %v", err)
	}
	// Once removed, the id is free, and quiet's rule decides its execs.
	if err := create("quiet"); err != nil {
		t.Fatalf("create x as quiet after the removal: %v", err)
	}
	if err := exec("e2"); !errdefs.IsPermissionDenied(err) {
		t.Errorf("exec in quiet: %v, want a policy denial", err)
	}
	if _, err := svc.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{ContainerId: "x"}); err != nil {
		t.Error(err)
	}
}

// TestRemovedContainerRefusesByID: what names a container by its id (the
// runtime's calls, its cgroup) is refused once its removal began, with
// NotFound; the removal waits for such a call already running.
func TestRemovedContainerRefusesByID(t *testing.T) {
	c := &container{id: "x"}
	running, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = c.byID(func() error {
			close(running)
			<-release
			return nil
		})
	}()
	<-running
	retired := make(chan struct{})
	go func() {
		c.retire()
		close(retired)
	}()
	select {
	case <-retired:
		t.Fatal("retire returned while a call by the container's id was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-retired
	ran := false
	if err := c.byID(func() error { ran = true; return nil }); !errdefs.IsNotFound(err) || ran {
		t.Fatalf("byID after retire: %v (ran: %v), want NotFound without running", err, ran)
	}
}

// TestMaliciousHostCreateDuringCleanup: while the agent cleans up after a
// failed create of x, or the leftovers of an x it does not hold, the host
// creates x again. Its id must stay taken until the cleanup is done: the
// cleanup's runtime delete and layer release by id would otherwise act on
// the new x.
func TestMaliciousHostCreateDuringCleanup(t *testing.T) {
	h := newSlowHarness(t)
	ctx := ctxT(t)
	for _, c := range []struct {
		name    string
		cleanUp func() error
	}{
		{"failed create", func() error {
			h.touch(t, "create-fail")
			if err := h.create(t, "x", "app"); err == nil {
				return fmt.Errorf("the create the runtime failed succeeded")
			}
			return nil
		}},
		{"leftovers", func() error {
			if err := os.MkdirAll(filepath.Join(h.root, "x"), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(h.root, "x", "state.json"), []byte("{}"), 0o644); err != nil {
				return err
			}
			_, err := h.svc.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{ContainerId: "x"})
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, f := range []string{"delete-hold", "delete-go", "delete-waiting"} {
				_ = os.Remove(filepath.Join(h.root, f))
			}
			h.touch(t, "delete-hold")
			done := make(chan error, 1)
			go func() { done <- c.cleanUp() }()
			h.await(t, "delete-waiting")
			for range 2 {
				if err := h.create(t, "x", "quiet"); !errdefs.IsAlreadyExists(err) {
					t.Errorf("create x while the agent cleans up an x: %v, want already exists", err)
				}
			}
			h.touch(t, "delete-go")
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			_ = os.Remove(filepath.Join(h.root, "delete-hold"))
			if err := h.create(t, "x", "quiet"); err != nil {
				t.Fatalf("create x once the cleanup is done: %v", err)
			}
			if _, err := h.svc.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{ContainerId: "x"}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMaliciousHostUsesSandboxBeingRemoved: while the pod's sandbox is
// being removed its init is killed, and its pid may come to name another
// process (the VM's own network namespace is never the pod's). Neither
// port-forward nor a pull may use it then.
func TestMaliciousHostUsesSandboxBeingRemoved(t *testing.T) {
	sb := &container{id: "sb", sandboxID: "sb", execs: map[string]*process{},
		init: &process{pid: os.Getpid(), done: make(chan struct{})}}
	s := &Service{containers: map[string]*container{"sb": sb}}
	pf := &portForward{s: s}
	if _, _, err := pf.podNetns(); err != nil {
		t.Fatalf("port-forward into the running sandbox: %v", err)
	}
	sb.removing = true // as RemoveContainer marks it, before the runtime's delete
	if path, _, err := pf.podNetns(); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("port-forward into a sandbox being removed: netns %q, %v; want failed precondition", path, err)
	}
	if f, err := netnsOf(sb); !errdefs.IsFailedPrecondition(err) || f != nil {
		t.Errorf("a pull in a sandbox being removed: %v, %v; want failed precondition", f, err)
	}
}
