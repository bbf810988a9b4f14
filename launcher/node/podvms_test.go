package node

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/node/internal/fakevms"
	"github.com/c8s-dev/c8s/launcher/node/reattest"
)

// The pod VMs re-attestation visits: live ones of the CRI namespace, in
// their own state dir.
func TestStateSandboxes(t *testing.T) {
	state, proc := filepath.Join(t.TempDir(), "c8s"), t.TempDir()
	pid := 200
	vm := func(dir, ns, id string, alive bool) {
		pid++
		fakevms.WriteFile(t, filepath.Join(dir, statedir.PidFile), []byte(strconv.Itoa(pid)))
		if err := statedir.WriteIndex(dir, statedir.Index{Namespace: ns, ID: id}); err != nil {
			t.Fatal(err)
		}
		if alive {
			fakevms.WriteFile(t, filepath.Join(proc, strconv.Itoa(pid), "cmdline"), fakevms.Cmdline(t, "sim", dir))
		}
	}
	vm(statedir.ForPod(state, "k8s.io", "aaa").VM, "k8s.io", "aaa", true)
	vm(statedir.ForPod(state, "k8s.io", "bbb").VM, "k8s.io", "bbb", false)  // QEMU gone
	vm(statedir.ForPod(state, "default", "ccc").VM, "default", "ccc", true) // not Kubernetes'
	vm(statedir.Incoming(state, "ddd"), "k8s.io", "ddd", true)              // migrating in
	long := strings.Repeat("0123456789abcdef", 4)                           // a CRI sandbox id: its dir name is shortened
	vm(statedir.ForPod(state, "k8s.io", long).VM, "k8s.io", long, true)
	got, err := StateSandboxes{StateRoot: state, ProcRoot: proc}.Sandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []reattest.Sandbox{{Namespace: "k8s.io", ID: long}, {Namespace: "k8s.io", ID: "aaa"}} // by state dir
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sandboxes %v, want %v", got, want)
	}
	if got, err := (StateSandboxes{StateRoot: filepath.Join(state, "none"), ProcRoot: proc}).Sandboxes(context.Background()); err != nil || len(got) != 0 {
		t.Errorf("no state root: %v %v", got, err)
	}
}

type fakeCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	stopped []string
}

func (f *fakeCRI) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if r.PodSandboxId != "sb1" {
		return nil, status.Error(codes.NotFound, "no sandbox "+r.PodSandboxId)
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: "sb1",
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "prod", Uid: "u1"}}}, nil
}

func (f *fakeCRI) StopPodSandbox(_ context.Context, r *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	f.stopped = append(f.stopped, r.PodSandboxId)
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func TestCRI(t *testing.T) {
	dir, err := os.MkdirTemp("", "c8s-cri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeCRI{}
	sock := filepath.Join(dir, "cri.sock")
	serve(t, sock, func(s *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(s, f) })
	c, err := NewCRI("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	p, err := c.Pod(ctx, reattest.Sandbox{Namespace: "k8s.io", ID: "sb1"})
	if err != nil || p != (reattest.Pod{Namespace: "prod", Name: "web", UID: "u1"}) {
		t.Errorf("Pod: %+v %v", p, err)
	}
	if _, err := c.Pod(ctx, reattest.Sandbox{ID: "nope"}); err == nil {
		t.Error("Pod of an unknown sandbox")
	}
	if err := c.StopSandbox(ctx, reattest.Sandbox{ID: "sb1"}); err != nil || !reflect.DeepEqual(f.stopped, []string{"sb1"}) {
		t.Errorf("StopSandbox: %v, stopped %v", err, f.stopped)
	}
}
