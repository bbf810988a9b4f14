package task

import (
	"context"
	"io"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/fifo"
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
