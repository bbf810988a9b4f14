package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestStreamKeepsDataUntilReadAfterClose(t *testing.T) {
	s := newStream()
	s.fill(io.MultiReader(bytes.NewReader([]byte("hello ")), bytes.NewReader([]byte("world"))))
	var got []byte
	for {
		data, eof, err := s.read(context.Background(), 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > 4 {
			t.Fatalf("read %d bytes, max 4", len(data))
		}
		got = append(got, data...)
		if eof {
			break
		}
	}
	if string(got) != "hello world" {
		t.Errorf("got %q", got)
	}
}

// eioReader returns data, then EIO as a pty master does once the terminal
// is gone.
type eioReader struct{ data []byte }

func (r *eioReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, unix.EIO
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestStreamTreatsEIOAsEOF(t *testing.T) {
	s := newStream()
	s.fill(&eioReader{data: []byte("tty output")})
	data, eof, err := s.read(context.Background(), 0)
	if err != nil || eof || string(data) != "tty output" {
		t.Fatalf("read = %q, %v, %v", data, eof, err)
	}
	if _, eof, err := s.read(context.Background(), 0); !eof || err != nil {
		t.Errorf("after EIO: eof %v, err %v; want eof", eof, err)
	}
}

func TestStreamReadBlocksUntilDataOrCancel(t *testing.T) {
	s := newStream()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := s.read(ctx, 0)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled read: err %v", err)
	}

	r, w := io.Pipe()
	go s.fill(r)
	got := make(chan []byte, 1)
	go func() {
		data, _, _ := s.read(context.Background(), 0)
		got <- data
	}()
	if _, err := w.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if data := <-got; string(data) != "late" {
		t.Errorf("blocked read got %q", data)
	}
	w.Close()
}

func TestStreamBackPressureLosesNothing(t *testing.T) {
	s := newStream()
	total := 3*streamBufferBytes + 123
	src := bytes.Repeat([]byte("0123456789abcdef"), total/16+1)[:total]
	go s.fill(bytes.NewReader(src))
	var got []byte
	for {
		data, eof, err := s.read(context.Background(), 64<<20)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > maxReadBytes {
			t.Fatalf("read returned %d bytes, more than the %d cap", len(data), maxReadBytes)
		}
		got = append(got, data...)
		s.mu.Lock()
		if len(s.buf) > streamBufferBytes+32*1024 {
			t.Errorf("buffer grew to %d bytes", len(s.buf))
		}
		s.mu.Unlock()
		if eof {
			break
		}
	}
	if !bytes.Equal(got, src) {
		t.Errorf("got %d bytes, want %d identical bytes", len(got), len(src))
	}
}

type closeCounter struct {
	bytes.Buffer
	closes int
}

func (c *closeCounter) Close() error { c.closes++; return nil }

func TestStdinCloseOnceAndRefuseLaterWrites(t *testing.T) {
	w := &closeCounter{}
	in := newStdin(w)
	if n, err := in.write(context.Background(), []byte("abc")); n != 3 || err != nil {
		t.Fatalf("write: %d, %v", n, err)
	}
	if err := in.close(stdinCloseWait); err != nil {
		t.Fatal(err)
	}
	if err := in.close(stdinCloseWait); err != nil {
		t.Fatal(err)
	}
	if w.closes != 1 || w.String() != "abc" {
		t.Errorf("closes %d, content %q", w.closes, w.String())
	}
	if _, err := in.write(context.Background(), []byte("x")); !errors.Is(err, errStdinClosed) {
		t.Errorf("write after close: %v", err)
	}
	if _, err := newStdin(nil).write(context.Background(), []byte("x")); !errors.Is(err, errNoStdin) {
		t.Errorf("write without stdin: %v", err)
	}
}

// A write that blocks (stdin's pipe is full and nothing reads it: a
// process, or a child of it, holds stdin open and never reads) does not
// hold CloseStdin or the release of the process up: close waits its bound,
// then closes the pipe, which ends the write. A later write is refused at
// once.
func TestStdinCloseEndsAWriteThatNeverCompletes(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	in := newStdin(w)
	wrote := make(chan error, 1)
	go func() {
		_, err := in.write(context.Background(), make([]byte, 1<<20)) // far more than a pipe holds
		wrote <- err
	}()
	time.Sleep(50 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- in.close(100 * time.Millisecond) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("close waited for a write that never completes")
	}
	select {
	case err := <-wrote:
		if err == nil {
			t.Error("the blocked write reported success")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("closing stdin did not end the blocked write")
	}
	if _, err := in.write(context.Background(), []byte("x")); !errors.Is(err, errStdinClosed) {
		t.Errorf("write after close: %v", err)
	}
}

// Close waits for a write in progress that completes, so what was written
// before CloseStdin reaches the process, followed by EOF.
func TestStdinCloseLetsAWriteInProgressFinish(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	in := newStdin(w)
	data := bytes.Repeat([]byte("x"), 256<<10)
	go in.write(context.Background(), data)
	time.Sleep(50 * time.Millisecond) // the write is blocked on the full pipe
	closed := make(chan error, 1)
	go func() { closed <- in.close(10 * time.Second) }()
	got, err := io.ReadAll(r) // reads until the close after the write
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes (%v), want the %d written before close", len(got), err, len(data))
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// Many processes whose output the host never reads hold at most the
// agent's output budget together (each stream alone is bounded too), and
// what a read or a forgotten process frees lets the others go on.
func TestMaliciousHostNeverReadsOutput(t *testing.T) {
	budget := newByteBudget(3 * streamBufferBytes)
	var streams []*stream
	for range 8 {
		s := newStream()
		s.budget = budget
		streams = append(streams, s)
		go s.fill(bytes.NewReader(bytes.Repeat([]byte("x"), 2*streamBufferBytes)))
	}
	held := func() int {
		n := 0
		for _, s := range streams {
			s.mu.Lock()
			n += len(s.buf)
			s.mu.Unlock()
		}
		return n
	}
	deadline := time.Now().Add(5 * time.Second)
	for held() < 3*streamBufferBytes-32*1024 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := held(); n > 3*streamBufferBytes {
		t.Fatalf("the agent holds %d bytes of unread output, over its budget of %d", n, 3*streamBufferBytes)
	}
	// A forgotten process's output is given back: the others take it.
	before := held()
	streams[0].drop()
	streams[1].drop()
	deadline = time.Now().Add(5 * time.Second)
	for held() <= before-2*streamBufferBytes+32*1024 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := held(); n > 3*streamBufferBytes || n <= before-2*streamBufferBytes+32*1024 {
		t.Fatalf("after two streams were dropped the others hold %d bytes (before %d, budget %d)", n, before, 3*streamBufferBytes)
	}
	for _, s := range streams {
		s.drop()
	}
	used := func() int {
		budget.mu.Lock()
		defer budget.mu.Unlock()
		return budget.used
	}
	// A fill may have taken a chunk's bytes just before its stream was
	// dropped: it gives them back at once.
	deadline = time.Now().Add(5 * time.Second)
	for used() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := used(); n != 0 {
		t.Fatalf("%d bytes still counted after every stream was dropped", n)
	}
}

// stuckWriter never completes a write, and closing it does not end one:
// a terminal's stdin (the pty master stays open at CloseStdin).
type stuckWriter struct{ release chan struct{} }

func (w stuckWriter) Write(p []byte) (int, error) { <-w.release; return 0, io.ErrClosedPipe }
func (stuckWriter) Close() error                  { return nil }

// Writes after CloseStdin are refused at once, also while a write stuck
// before it holds the turn: they must not queue up behind it, each
// holding its data in the agent.
func TestStdinWritesAfterCloseDoNotQueue(t *testing.T) {
	w := stuckWriter{release: make(chan struct{})}
	defer close(w.release)
	in := newStdin(w)
	go in.write(context.Background(), []byte("stuck"))
	time.Sleep(20 * time.Millisecond)
	if err := in.close(20 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := in.write(context.Background(), []byte("later")); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, errStdinClosed) {
			t.Fatalf("a write after close: %v, want %v", err, errStdinClosed)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a write after close queued behind the stuck one")
	}
	// Before close, a write waiting for its turn ends with its request.
	in = newStdin(stuckWriter{release: w.release})
	go in.write(context.Background(), []byte("stuck"))
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := in.write(ctx, []byte("waits")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a write waiting for its turn past its request: %v", err)
	}
}
