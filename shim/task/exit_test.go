package task

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// endlessIO is an agent IO service whose output streams never end, as the
// guest's do while a child of the exited process still holds them open.
type endlessIO struct {
	agent.IOService
	first chan struct{} // closed at the first read
}

func (f *endlessIO) ReadStdout(ctx context.Context, _ *agent.ReadStreamRequest) (*agent.ReadStreamResponse, error) {
	select {
	case <-f.first:
		<-ctx.Done()
		return nil, ctx.Err()
	default:
		close(f.first)
		return &agent.ReadStreamResponse{Data: []byte("last words\n")}, nil
	}
}

// TestExitClosesOutputsThatNeverEnd: containerd finishes handling an exit
// only once the process's output FIFOs are closed (CRI's StopContainer
// waits for that). When a process has exited but something in the guest
// keeps its stream open, the exit still closes them after the drain
// timeout, after copying what had arrived, and publishes TaskExit.
func TestExitClosesOutputsThatNeverEnd(t *testing.T) {
	dir := t.TempDir()
	stdoutPath := filepath.Join(dir, "stdout")
	if err := syscall.Mkfifo(stdoutPath, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// containerd's side of the FIFO, as its cio opens it.
	reader, err := fifo.OpenFifo(ctx, stdoutPath, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	read := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(reader); read <- b }()

	s := &service{ctx: ctx, events: make(chan interface{}, 4)}
	p := newProcess("c1", "", stdio.Stdio{Stdout: stdoutPath}, nil)
	fake := &endlessIO{first: make(chan struct{})}
	if err := p.startIO(ctx, fake, nil); err != nil {
		t.Fatal(err)
	}
	<-fake.first

	done := make(chan struct{})
	go func() { s.exited(p, 0, time.Now()); close(done) }()
	select {
	case <-done:
	case <-time.After(ioDrainTimeout + 5*time.Second):
		t.Fatal("the exit waits for an output stream that never ends")
	}
	select {
	case b := <-read:
		if string(b) != "last words\n" {
			t.Errorf("containerd read %q from the FIFO, want the output that had arrived", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stdout FIFO was not closed after the exit: containerd would wait for it forever")
	}
	select {
	case e := <-s.events:
		if ex, ok := e.(*eventstypes.TaskExit); !ok || ex.ContainerID != "c1" {
			t.Errorf("event %#v, want TaskExit of c1", e)
		}
	default:
		t.Error("no TaskExit published")
	}
}

// TestKillOfExitedProcessIsNotFound: as with runc's shim, signalling a
// process that has exited is NotFound (containerd's WithProcessKill then
// just waits for the exit it already has).
func TestKillOfExitedProcessIsNotFound(t *testing.T) {
	p := newProcess("c1", "", stdio.Stdio{}, nil)
	p.setExited(0, time.Now())
	s := &service{conts: map[string]*container{"c1": {id: "c1", init: p, execs: map[string]*process{}}}}
	_, err := s.Kill(context.Background(), &taskAPI.KillRequest{ID: "c1", Signal: 15})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Kill of an exited process: %v, want NotFound", err)
	}
}

// TestConnectWithoutTaskAnswersForTheShim: CRI calls Connect with an empty
// id; runc's shim answers with its own pid.
func TestConnectWithoutTaskAnswersForTheShim(t *testing.T) {
	s := &service{conts: map[string]*container{}}
	resp, err := s.Connect(context.Background(), &taskAPI.ConnectRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.ShimPid != uint32(os.Getpid()) || resp.TaskPid != 0 {
		t.Errorf("Connect(\"\") = shim %d task %d, want shim %d task 0", resp.ShimPid, resp.TaskPid, os.Getpid())
	}
	if _, err := s.Connect(context.Background(), &taskAPI.ConnectRequest{ID: "nope"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Connect of an unknown task: %v, want NotFound", err)
	}
}
