package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/shim/sandbox"
	"github.com/c8s-dev/c8s/shim/task/internal/fakesandbox"
)

// The task service against a fake pod VM (internal/fakesandbox): each
// test drives the task API as containerd does and checks what reached the
// guest and which events were published.

// fakeHost is the fake's Host as the service's: Start returns the
// concrete *fakesandbox.Sandbox.
type fakeHost struct{ *fakesandbox.Host }

func (h fakeHost) OpenImages(ctx context.Context) (Images, error) {
	i, err := h.Host.OpenImages(ctx)
	if err != nil {
		return nil, err
	}
	return i, nil
}

func (h fakeHost) StartSandbox(ctx context.Context, opts sandbox.Options) (Sandbox, error) {
	sb, err := h.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

// published is one event the service published.
type published struct {
	topic string
	event any
}

// recorder is the shim's event publisher.
type recorder struct {
	events chan published
	mu     sync.Mutex
	closed bool
}

func (r *recorder) Publish(_ context.Context, topic string, event events.Event) error {
	r.events <- published{topic, event}
	return nil
}

func (r *recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return nil
}

func (r *recorder) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

type harness struct {
	t        *testing.T
	ctx      context.Context
	s        *service
	host     *fakesandbox.Host
	pub      *recorder
	sd       shutdown.Service
	config   string // the c8s config file
	stateDir string
}

// wait bounds every wait of a test for something the service does in the
// background.
const wait = 5 * time.Second

// setup is what a test adds to the harness's c8s config (TOML): keys of
// [hypervisor], and tables after it. Attestation is off unless tables
// has an [attestation] table.
type setup struct {
	hypervisor, tables string
}

// newHarness returns a task service on a fake host.
func newHarness(t *testing.T, cfg setup) *harness {
	t.Helper()
	// runtime.state_dir is short (statedir.MaxRoot): not under t.TempDir.
	stateDir, err := os.MkdirTemp("", "c8s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stateDir) })
	dir := t.TempDir()
	for _, f := range []string{"qemu", "vmlinuz", "initrd"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	doc := fmt.Sprintf("[hypervisor]\npath = %q\nkernel = %q\ninitrd = %q\n%s\n[runtime]\nstate_dir = %q\n%s\n",
		filepath.Join(dir, "qemu"), filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd"), cfg.hypervisor, stateDir, cfg.tables)
	if !strings.Contains(cfg.tables, "[attestation]") {
		doc += "[attestation]\nmode = \"off\"\n"
	}
	path := filepath.Join(dir, "c8s.toml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := namespaces.WithNamespace(context.Background(), "test")
	sdCtx, sd := shutdown.WithShutdown(ctx)
	pub := &recorder{events: make(chan published, 256)}
	host := fakesandbox.NewHost()
	s := newService(sdCtx, pub, sd, fakeHost{host})
	t.Cleanup(func() {
		sd.Shutdown()
		select {
		case <-sd.Done():
		case <-time.After(wait):
			t.Error("the shim did not shut down")
		}
	})
	return &harness{t: t, ctx: ctx, s: s, host: host, pub: pub, sd: sd, config: path, stateDir: stateDir}
}

// bundle writes a bundle for container id whose spec has annotations
// (CRI's sandbox id ties the containers of a pod) and returns its path.
func (h *harness) bundle(id string, annotations map[string]string) string {
	h.t.Helper()
	dir := filepath.Join(h.t.TempDir(), id)
	if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		h.t.Fatal(err)
	}
	spec := specs.Spec{
		Version:     specs.Version,
		Process:     &specs.Process{Args: []string{"/bin/sh"}, Cwd: "/"},
		Root:        &specs.Root{Path: "rootfs"},
		Annotations: annotations,
	}
	data, err := json.Marshal(&spec)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		h.t.Fatal(err)
	}
	return dir
}

// request is a Create of container id in pod (the sandbox id; "" for a
// container without a pod) as containerd sends it.
func (h *harness) request(id, pod string) *taskAPI.CreateTaskRequest {
	h.t.Helper()
	var ann map[string]string
	if pod != "" {
		ann = map[string]string{SandboxIDAnnotation: pod}
	}
	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: h.config})
	if err != nil {
		h.t.Fatal(err)
	}
	return &taskAPI.CreateTaskRequest{ID: id, Bundle: h.bundle(id, ann), Options: opts}
}

// create creates container id in pod and fails the test on error.
func (h *harness) create(id, pod string) uint32 {
	h.t.Helper()
	resp, err := h.s.Create(h.ctx, h.request(id, pod))
	if err != nil {
		h.t.Fatalf("Create %s: %v", id, err)
	}
	return resp.Pid
}

// start starts a process and fails the test on error.
func (h *harness) start(id, execID string) uint32 {
	h.t.Helper()
	resp, err := h.s.Start(h.ctx, &taskAPI.StartRequest{ID: id, ExecID: execID})
	if err != nil {
		h.t.Fatalf("Start %s %s: %v", id, execID, err)
	}
	return resp.Pid
}

// exec adds exec execID to container id and fails the test on error.
func (h *harness) exec(id, execID string, stdio ...string) {
	h.t.Helper()
	spec, err := typeurl.MarshalAnyToProto(&specs.Process{Args: []string{"/bin/true"}, Cwd: "/"})
	if err != nil {
		h.t.Fatal(err)
	}
	r := &taskAPI.ExecProcessRequest{ID: id, ExecID: execID, Spec: spec}
	if len(stdio) == 2 {
		r.Stdin, r.Stdout = stdio[0], stdio[1]
	}
	if _, err := h.s.Exec(h.ctx, r); err != nil {
		h.t.Fatalf("Exec %s %s: %v", id, execID, err)
	}
}

// vm is the pod VM the service started (the test fails if there is
// none).
func (h *harness) vm() *fakesandbox.Sandbox {
	h.t.Helper()
	started := h.host.Started()
	if len(started) == 0 {
		h.t.Fatal("no pod VM was started")
	}
	return started[len(started)-1]
}

// next returns the next published event, failing the test if none comes.
func (h *harness) next() published {
	h.t.Helper()
	select {
	case e := <-h.pub.events:
		return e
	case <-time.After(wait):
		h.t.Fatal("no event published")
		return published{}
	}
}

// expect checks that the next events have these topics, in order, and
// returns them.
func (h *harness) expect(topics ...string) []any {
	h.t.Helper()
	var out []any
	for _, want := range topics {
		e := h.next()
		if e.topic != want {
			h.t.Fatalf("event %s %+v, want %s", e.topic, e.event, want)
		}
		out = append(out, e.event)
	}
	return out
}

// quiet checks that nothing more is published for a while.
func (h *harness) quiet() {
	h.t.Helper()
	select {
	case e := <-h.pub.events:
		h.t.Fatalf("unexpected event %s %+v", e.topic, e.event)
	case <-time.After(50 * time.Millisecond):
	}
}

// waitExit waits for a process's exit through the task API.
func (h *harness) waitExit(id, execID string) *taskAPI.WaitResponse {
	h.t.Helper()
	resp, err := h.waitFor(id, execID)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

// waitFor is Wait bounded by wait, for use outside the test's goroutine.
func (h *harness) waitFor(id, execID string) (*taskAPI.WaitResponse, error) {
	ctx, cancel := context.WithTimeout(h.ctx, wait)
	defer cancel()
	resp, err := h.s.Wait(ctx, &taskAPI.WaitRequest{ID: id, ExecID: execID})
	if err != nil {
		return nil, fmt.Errorf("Wait %s %s: %w", id, execID, err)
	}
	return resp, nil
}

// state is State of a process; it fails the test on error.
func (h *harness) state(id, execID string) *taskAPI.StateResponse {
	h.t.Helper()
	resp, err := h.s.State(h.ctx, &taskAPI.StateRequest{ID: id, ExecID: execID})
	if err != nil {
		h.t.Fatalf("State %s %s: %v", id, execID, err)
	}
	return resp
}

// isClass reports whether err is of errdefs class class.
func isClass(err, class error) bool {
	return err != nil && errors.Is(err, class)
}

// errClass names the errdefs class of err, for messages.
func errClass(err error) string {
	if err == nil {
		return "no error"
	}
	return errdefs.Resolve(err).Error() + ": " + err.Error()
}

// topics of the events the service publishes.
var (
	topicCreate      = runtime.GetTopic(&eventstypes.TaskCreate{})
	topicStart       = runtime.GetTopic(&eventstypes.TaskStart{})
	topicExit        = runtime.GetTopic(&eventstypes.TaskExit{})
	topicOOM         = runtime.GetTopic(&eventstypes.TaskOOM{})
	topicDelete      = runtime.GetTopic(&eventstypes.TaskDelete{})
	topicExecAdded   = runtime.GetTopic(&eventstypes.TaskExecAdded{})
	topicExecStarted = runtime.GetTopic(&eventstypes.TaskExecStarted{})
)
