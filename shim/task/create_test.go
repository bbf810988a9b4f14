package task

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/shim/sandbox"
	"github.com/c8s-dev/c8s/shim/task/internal/fakesandbox"
)

// Create of the pod's first container boots the pod VM with the
// container's root disk attached, creates the container in the guest from
// the bundle's spec, records the bundle state and publishes TaskCreate.
func TestCreateBootsThePodVM(t *testing.T) {
	h := newHarness(t, setup{})
	pid := h.create("pod1", "pod1")

	sb := h.vm()
	opts := sb.Options()
	disk := filepath.Join(filepath.Dir(opts.Disks[0].Path), "pod1.img")
	if opts.ID != "pod1" || len(opts.Disks) != 1 || opts.Disks[0].ID != diskID("pod1") || opts.Disks[0].Path != disk ||
		!strings.HasPrefix(opts.StateDir, h.stateDir) || !strings.HasPrefix(disk, h.stateDir) {
		t.Fatalf("VM started with %+v, want pod1 with its root disk under %s", opts, h.stateDir)
	}
	if built, _ := h.host.Images(); len(built) != 1 || built[0] != disk {
		t.Errorf("root disks built: %v, want %s", built, disk)
	}
	calls := sb.Calls("CreateContainer")
	if len(calls) != 1 {
		t.Fatalf("CreateContainer calls: %d, want 1", len(calls))
	}
	req := calls[0].Req.(*agent.CreateContainerRequest)
	if req.ContainerId != "pod1" || req.SandboxId != "pod1" || req.Rootfs.GetScsi().GetLun() != 0 || req.Rootfs.GetFstype() != "ext4" {
		t.Errorf("CreateContainer %+v, want pod1 on LUN 0 (its boot disk), ext4", req)
	}
	if req.Network != nil || req.SharedMounts != nil {
		t.Errorf("a pod without netns or share got network %v, shares %v", req.Network, req.SharedMounts)
	}
	if pid != 100 {
		t.Errorf("Create pid %d, want the guest's 100", pid)
	}
	ev := h.expect(topicCreate)[0].(*eventstypes.TaskCreate)
	if ev.ContainerID != "pod1" || ev.Pid != pid || ev.Bundle == "" {
		t.Errorf("TaskCreate %+v", ev)
	}
	st, err := ReadBundleState(ev.Bundle)
	if err != nil || st.Sandbox != "pod1" || st.StateDir != opts.StateDir || st.Disk != disk {
		t.Errorf("bundle state %+v, %v", st, err)
	}
	if s := h.state("pod1", ""); s.Status != task.Status_CREATED || s.Pid != pid || s.Bundle != ev.Bundle || s.ID != "pod1" {
		t.Errorf("State %+v, want created pod1 with pid %d", s, pid)
	}
	if got := sb.Calls("Attest", "HandInitData"); len(got) != 0 {
		t.Errorf("attestation off, no init data: %v", got)
	}
}

// A container CRI made reports QEMU's pid for all its processes; others
// keep the guest's (criview.go).
func TestCRIContainersReportQEMUPid(t *testing.T) {
	h := newHarness(t, setup{})
	r := h.request("pod1", "pod1")
	r.Bundle = h.bundle("pod1", map[string]string{SandboxIDAnnotation: "pod1", ContainerTypeAnnotation: "sandbox"})
	resp, err := h.s.Create(h.ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Pid != fakesandbox.QEMUPid {
		t.Errorf("Create pid %d, want QEMU's %d", resp.Pid, fakesandbox.QEMUPid)
	}
	if pid := h.start("pod1", ""); pid != fakesandbox.QEMUPid {
		t.Errorf("Start pid %d, want QEMU's", pid)
	}
	h.exec("pod1", "e1")
	if pid := h.start("pod1", "e1"); pid != fakesandbox.QEMUPid {
		t.Errorf("exec pid %d, want QEMU's", pid)
	}
}

// Later containers of the pod join its VM with a hot-plugged disk; a
// container of another pod is refused. Deleting a container that is not
// the last removes it from the guest and unplugs its disk; the last takes
// the VM with it.
func TestPodContainersShareTheVM(t *testing.T) {
	h := newHarness(t, setup{})
	h.create("pod1", "pod1")
	h.create("c1", "pod1")
	h.expect(topicCreate, topicCreate)
	if n := len(h.host.Started()); n != 1 {
		t.Fatalf("%d VMs started for one pod", n)
	}
	sb := h.vm()
	calls := sb.Calls("CreateContainer")
	if len(calls) != 2 || calls[1].Req.(*agent.CreateContainerRequest).Rootfs.GetScsi().GetLun() != 1 {
		t.Fatalf("CreateContainer of c1: %+v, want its disk on LUN 1", calls)
	}
	if _, ok := sb.Disks()[diskID("c1")]; !ok {
		t.Fatal("c1's disk was not hot-plugged")
	}

	if _, err := h.s.Create(h.ctx, h.request("x", "pod2")); !isClass(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "pod2") {
		t.Fatalf("Create in another sandbox: %v, want InvalidArgument naming it", errClass(err))
	}

	// c1 was created, never started: removing it kills it in the guest;
	// its exit is not published after TaskDelete.
	if _, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if del := h.expect(topicDelete)[0].(*eventstypes.TaskDelete); del.ContainerID != "c1" {
		t.Errorf("TaskDelete %+v", del)
	}
	h.quiet()
	if got := sb.Calls("RemoveContainer", "DetachDisk"); len(got) != 2 || got[0].Req.(*agent.RemoveContainerRequest).ContainerId != "c1" || got[1].Req != diskID("c1") {
		t.Fatalf("Delete c1: %+v, want RemoveContainer and DetachDisk of its disk", got)
	}
	_, removed := h.host.Images()
	if len(removed) != 1 || filepath.Base(removed[0]) != "c1.img" {
		t.Errorf("images removed: %v, want c1's", removed)
	}
	if sb.Stopped() {
		t.Fatal("the VM stopped with a container left")
	}
	if _, err := h.s.State(h.ctx, &taskAPI.StateRequest{ID: "c1"}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("State of a deleted container: %v, want NotFound", errClass(err))
	}

	if _, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "pod1"}); err != nil {
		t.Fatal(err)
	}
	h.expect(topicDelete)
	if !sb.Stopped() {
		t.Error("the VM outlived its last container")
	}
	if n := len(sb.Calls("RemoveContainer")); n != 1 {
		t.Errorf("RemoveContainer called %d times, want only for c1 (the last container goes with the VM)", n)
	}
	if _, err := os.Stat(filepath.Dir(sb.Options().Disks[0].Path)); !os.IsNotExist(err) {
		t.Errorf("pod disk dir after the pod: %v", err)
	}
}

func TestCreateErrors(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		name  string
		setup setup
		// prepare creates what the failing Create needs and returns it.
		prepare func(h *harness) *taskAPI.CreateTaskRequest
		class   error // nil: no errdefs class
		msg     string
		vms     int  // VMs started
		stopped bool // the VM was stopped again
		reached bool // the container reached the guest (which refused it)
		removed bool // the guest was asked to remove it again
	}{
		{name: "empty id", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			r := h.request("c1", "")
			r.ID = ""
			return r
		}, class: errdefs.ErrInvalidArgument},
		{name: "path id", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			r := h.request("c1", "")
			r.ID = "../c1"
			return r
		}, class: errdefs.ErrInvalidArgument},
		{name: "exists", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.create("c1", "")
			h.expect(topicCreate)
			return h.request("c1", "")
		}, class: errdefs.ErrAlreadyExists, vms: 1},
		{name: "no spec", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			r := h.request("c1", "")
			os.Remove(filepath.Join(r.Bundle, "config.json"))
			return r
		}, msg: "OCI spec"},
		{name: "no namespace", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.ctx = context.Background()
			return h.request("c1", "")
		}, class: errdefs.ErrFailedPrecondition, msg: "namespace"},
		{name: "hostname without UTS namespace", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			r := h.request("c1", "")
			spec := `{"ociVersion":"1.1.0","hostname":"web","process":{"args":["sh"],"cwd":"/"},"linux":{"namespaces":[{"type":"pid"}]}}`
			os.WriteFile(filepath.Join(r.Bundle, "config.json"), []byte(spec), 0o644)
			return r
		}, class: errdefs.ErrInvalidArgument, msg: "without a private UTS namespace"},
		{name: "bad spec", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			r := h.request("c1", "")
			os.WriteFile(filepath.Join(r.Bundle, "config.json"), []byte("{"), 0o644)
			return r
		}, class: errdefs.ErrInvalidArgument, msg: "config.json"},
		{name: "no config", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			os.Remove(h.config)
			return h.request("c1", "")
		}, class: errdefs.ErrInvalidArgument, msg: "c8s configuration"},
		{name: "bad init data", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			r := h.request("c1", "")
			r.Bundle = h.bundle("c1", map[string]string{initdata.Annotation: "%%%"})
			return r
		}, class: errdefs.ErrInvalidArgument, msg: "base64"},
		{name: "host rootfs refused", setup: setup{hypervisor: `tee = "tdx"
firmware = "/proc/self/exe"`}, prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			return h.request("c1", "")
		}, class: errdefs.ErrFailedPrecondition, msg: "allow_host_rootfs"},
		{name: "root disk", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.host.Fail("BuildRootfs", boom)
			return h.request("c1", "")
		}, msg: "prepare the root disk"},
		{name: "VM start", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.host.Fail("StartSandbox", boom)
			return h.request("c1", "")
		}, msg: "boom"},
		{name: "attestation", setup: setup{tables: "[attestation]\nmode = \"required\"\n"}, prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.host.Next().Fail("Attest", boom)
			return h.request("c1", "")
		}, class: errdefs.ErrFailedPrecondition, msg: "attestation of pod VM c1 failed: boom", vms: 1, stopped: true},
		{name: "init data hand-over", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.host.Next().Fail("HandInitData", boom)
			r := h.request("c1", "")
			r.Bundle = h.bundle("c1", map[string]string{initdata.Annotation: base64.StdEncoding.EncodeToString([]byte("version = \"0.1\"\n"))})
			return r
		}, msg: "boom", vms: 1, stopped: true},
		{name: "guest refuses the first", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.host.Next().Fail("CreateContainer", fmt.Errorf("no such user: %w", errdefs.ErrInvalidArgument))
			return h.request("c1", "")
		}, class: errdefs.ErrInvalidArgument, msg: "no such user", vms: 1, stopped: true, reached: true},
		{name: "guest refuses a later one", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.create("pod1", "pod1")
			h.expect(topicCreate)
			h.vm().Fail("CreateContainer", fmt.Errorf("no such user: %w", errdefs.ErrInvalidArgument))
			return h.request("c1", "pod1")
		}, class: errdefs.ErrInvalidArgument, msg: "no such user", vms: 1, reached: true},
		{name: "stdio FIFO", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.create("pod1", "pod1")
			h.expect(topicCreate)
			r := h.request("c1", "pod1")
			r.Stdout = filepath.Join(h.t.TempDir(), "missing", "stdout")
			return r
		}, msg: "open the stdio FIFOs", vms: 1, reached: true, removed: true},
		{name: "disk hot-plug", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.create("pod1", "pod1")
			h.expect(topicCreate)
			h.vm().Fail("AttachDisk", boom)
			return h.request("c1", "pod1")
		}, msg: "attach the root disk", vms: 1},
		{name: "VM gone", prepare: func(h *harness) *taskAPI.CreateTaskRequest {
			h.create("pod1", "pod1")
			h.expect(topicCreate)
			h.vm().Die(boom)
			h.expect(topicExit)
			return h.request("c1", "pod1")
		}, class: errdefs.ErrFailedPrecondition, msg: "has exited", vms: 1, stopped: false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, c.setup)
			r := c.prepare(h)
			creates := func() int {
				n := 0
				for _, vm := range h.host.Started() {
					n += len(vm.Calls("CreateContainer"))
				}
				return n
			}
			builtBefore, _ := h.host.Images()
			createsBefore := creates()
			_, err := h.s.Create(h.ctx, r)
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if c.class != nil && !errors.Is(err, c.class) {
				t.Errorf("Create: %v, want %v", errClass(err), c.class)
			}
			if c.class == nil && errdefs.Resolve(err) != errdefs.ErrUnknown {
				t.Errorf("Create: %v, want no errdefs class", errClass(err))
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("Create: %v, want it to say %q", err, c.msg)
			}
			vms := h.host.Started()
			if len(vms) != c.vms {
				t.Fatalf("%d VMs started, want %d", len(vms), c.vms)
			}
			if c.vms > 0 && vms[0].Stopped() != c.stopped {
				t.Errorf("VM stopped: %v, want %v", vms[0].Stopped(), c.stopped)
			}
			if reached := creates() > createsBefore; reached != c.reached {
				t.Errorf("the container reached the guest: %v, want %v", reached, c.reached)
			}
			// The root disk the failed Create built is removed again.
			built, removed := h.host.Images()
			for _, img := range built[len(builtBefore):] {
				if !contains(removed, img) {
					t.Errorf("root disk %s left behind", img)
				}
			}
			if got := len(vms) > 0 && len(vms[0].Calls("RemoveContainer")) > 0; got != c.removed {
				t.Errorf("RemoveContainer in the guest: %v, want %v", got, c.removed)
			}
			if c.reached && !c.stopped {
				if d := vms[0].Calls("DetachDisk"); len(d) != 1 || d[0].Req != diskID(r.ID) {
					t.Errorf("the disk of the refused container was not unplugged: %+v", d)
				}
			}
			if c.class != errdefs.ErrAlreadyExists {
				if _, err := h.s.State(h.ctx, &taskAPI.StateRequest{ID: r.ID}); !isClass(err, errdefs.ErrNotFound) {
					t.Errorf("State after the failed Create: %v, want NotFound", errClass(err))
				}
			}
			h.quiet() // no TaskCreate
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Attestation gates the pod: with attestation required the VM is
// attested before any container reaches it; with it off, init data is
// still handed over.
func TestAttestationBeforeTheFirstContainer(t *testing.T) {
	h := newHarness(t, setup{tables: "[attestation]\nmode = \"required\"\n"})
	h.host.Next().SetVerified(&sandbox.Verified{Provider: "sim", SNP: &attest.SNPClaims{VCPUs: 1}})
	h.create("c1", "")
	calls := h.vm().Calls("Attest", "HandInitData", "CreateContainer")
	if len(calls) != 2 || calls[0].Method != "Attest" || calls[1].Method != "CreateContainer" {
		t.Fatalf("calls %+v, want Attest then CreateContainer", calls)
	}
	if cfg := calls[0].Req.(config.Config); cfg.Attestation.Mode != config.AttestRequired {
		t.Errorf("attested against %+v", cfg.Attestation)
	}

	h = newHarness(t, setup{})
	doc := "version = \"0.1\"\n"
	r := h.request("c1", "")
	r.Bundle = h.bundle("c1", map[string]string{initdata.Annotation: base64.StdEncoding.EncodeToString([]byte(doc))})
	if _, err := h.s.Create(h.ctx, r); err != nil {
		t.Fatal(err)
	}
	sb := h.vm()
	calls = sb.Calls("Attest", "HandInitData", "CreateContainer")
	if len(calls) != 2 || calls[0].Method != "HandInitData" || calls[1].Method != "CreateContainer" {
		t.Fatalf("calls %+v, want HandInitData then CreateContainer", calls)
	}
	if string(sb.Options().InitData) != doc || sb.Options().Config.Hypervisor.SNP.HostData == "" {
		t.Errorf("VM started with init data %q, host data %q", sb.Options().InitData, sb.Options().Config.Hypervisor.SNP.HostData)
	}
}
