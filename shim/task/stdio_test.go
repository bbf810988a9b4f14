package task

import (
	"context"
	"io"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/fifo"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// An exec's stdio goes through containerd's FIFOs and the guest's IO
// service: what the client writes reaches the guest's stdin, its EOF
// closes that stdin, and the guest's output reaches the stdout FIFO,
// which is closed at the exit.
func TestExecStdio(t *testing.T) {
	h := running(t, setup{})
	dir := t.TempDir()
	stdinPath, stdoutPath := filepath.Join(dir, "stdin"), filepath.Join(dir, "stdout")
	for _, p := range []string{stdinPath, stdoutPath} {
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// containerd's ends, opened as its cio opens them.
	stdout, err := fifo.OpenFifo(ctx, stdoutPath, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stdin, err := fifo.OpenFifo(ctx, stdinPath, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan string, 1)
	go func() { b, _ := io.ReadAll(stdout); read <- string(b) }()

	h.exec("c1", "io", stdinPath, stdoutPath)
	h.start("c1", "io")
	sb := h.vm()

	if _, err := stdin.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	deadline := time.Now().Add(wait)
	for {
		data, closed, err := sb.Stdin("c1", "io")
		if err != nil {
			t.Fatal(err)
		}
		if closed {
			if data != "hello\n" {
				t.Errorf("the guest's stdin got %q", data)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest's stdin was not closed at the client's EOF (got %q)", data)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := h.s.CloseIO(h.ctx, &taskAPI.CloseIORequest{ID: "c1", ExecID: "io", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	if n := len(sb.Calls("CloseStdin")); n != 1 {
		t.Errorf("the guest's stdin was closed %d times, want once", n)
	}

	if err := sb.Output("c1", "io", "out\n", ""); err != nil {
		t.Fatal(err)
	}
	if err := sb.Exit("c1", "io", 0, false); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-read:
		if got != "out\n" {
			t.Errorf("containerd read %q from the stdout FIFO", got)
		}
	case <-time.After(wait):
		t.Fatal("the stdout FIFO was not closed at the exit")
	}
	h.expect(topicExecAdded, topicExecStarted, topicExit)
}

// stuckStdin is a guest whose stdin never takes what is written (a process
// that holds stdin open and never reads): WriteStdin blocks until its call
// is cancelled. It counts CloseStdin calls.
type stuckStdin struct {
	agent.IOService
	agent.AgentService
	writing chan struct{}
	closes  atomic.Int32
}

func (s *stuckStdin) WriteStdin(ctx context.Context, _ *agent.WriteStdinRequest) (*agent.WriteStdinResponse, error) {
	select {
	case s.writing <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *stuckStdin) CloseStdin(context.Context, *agent.ProcessRequest) (*agent.Empty, error) {
	s.closes.Add(1)
	return &agent.Empty{}, nil
}

// CloseIO returns, and closes the guest's stdin, even while the stdin copy
// is blocked in a write the guest cannot complete: the copy's call is
// cancelled once the drain bound has passed.
func TestCloseIOEndsAStdinCopyTheGuestDoesNotTake(t *testing.T) {
	defer func(d time.Duration) { stdinDrainTimeout = d }(stdinDrainTimeout)
	stdinDrainTimeout = 100 * time.Millisecond
	path := filepath.Join(t.TempDir(), "stdin")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	guest := &stuckStdin{writing: make(chan struct{}, 1)}
	p := newProcess("c1", "", stdio.Stdio{Stdin: path}, nil)
	if err := p.startIO(ctx, guest, guest); err != nil {
		t.Fatal(err)
	}
	defer p.releaseIO()
	client, err := fifo.OpenFifo(ctx, path, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close() // the client keeps its end open
	if _, err := client.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-guest.writing:
	case <-ctx.Done():
		t.Fatal("the stdin copy did not write to the guest")
	}
	done := make(chan error, 1)
	go func() { done <- p.closeStdin(ctx, guest) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("CloseIO waited for a stdin write the guest never completes")
	}
	if n := guest.closes.Load(); n != 1 {
		t.Errorf("the guest's stdin was closed %d times, want once", n)
	}
}

// An exec whose IO setup failed after its stdin FIFO was opened (its
// stdout FIFO is missing) has no copy: CloseIO closes the guest's stdin at
// once, rather than wait for a copy that never ran.
func TestCloseIOAfterFailedStartIO(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "stdin")
	if err := syscall.Mkfifo(in, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	guest := &stuckStdin{writing: make(chan struct{}, 1)}
	p := newProcess("c1", "e1", stdio.Stdio{Stdin: in, Stdout: filepath.Join(dir, "missing", "stdout")}, nil)
	if err := p.startIO(ctx, guest, guest); err == nil {
		t.Fatal("startIO succeeded without a stdout FIFO")
	}
	done := make(chan error, 1)
	go func() { done <- p.closeStdin(ctx, guest) }()
	select {
	case err := <-done:
		if err != nil || guest.closes.Load() != 1 {
			t.Fatalf("CloseIO: %v, the guest's stdin closed %d times", err, guest.closes.Load())
		}
	case <-time.After(2 * stdinDrainTimeout):
		t.Fatal("CloseIO waited for a stdin copy that never ran")
	}
}
