package agent

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// defaultReadBytes answers reads that leave max_bytes at 0.
	defaultReadBytes = 32 * 1024
	// maxReadBytes caps a read's reply well below ttrpc's 4 MiB message
	// limit.
	maxReadBytes = 1 << 20
	// streamBufferBytes is how much output the agent holds per stream
	// before the process's writes block (back-pressure, never loss).
	streamBufferBytes = 1 << 20
	// outputBufferBytes is how much output the agent holds for every
	// process of the VM together: the agent's memory is charged to no
	// container, and a host that starts execs and never reads their
	// output would otherwise grow it until the guest's OOM killer takes
	// the pod's containers. Past it, writers block as on a full stream.
	outputBufferBytes = 64 << 20
)

// outputBudget is the agent's (one per VM) bound on buffered output.
var outputBudget = newByteBudget(outputBufferBytes)

// byteBudget counts bytes held against a maximum.
type byteBudget struct {
	mu      sync.Mutex
	used    int
	max     int
	changed chan struct{} // closed and replaced whenever used drops
}

func newByteBudget(max int) *byteBudget {
	return &byteBudget{max: max, changed: make(chan struct{})}
}

// take waits until n more bytes fit, then counts them; false, counting
// nothing, if stop closes first.
func (b *byteBudget) take(n int, stop <-chan struct{}) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.used+n > b.max {
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-stop:
			b.mu.Lock()
			return false
		}
		b.mu.Lock()
	}
	b.used += n
	return true
}

// give returns n bytes.
func (b *byteBudget) give(n int) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	close(b.changed)
	b.changed = make(chan struct{})
}

// stream buffers one output stream of a process from the moment the process
// is created, so nothing is lost if the process exits before the host reads.
type stream struct {
	mu     sync.Mutex
	buf    []byte
	closed bool
	err    error
	// changed is closed and replaced whenever buf or closed changes.
	changed chan struct{}
	// budget counts buf against the agent's outputBudget; dropped is
	// closed when the stream's output is dropped.
	budget  *byteBudget
	dropped chan struct{}
}

func newStream() *stream {
	return &stream{changed: make(chan struct{}), budget: outputBudget, dropped: make(chan struct{})}
}

// closedStream is a stream for an output the process does not have.
func closedStream() *stream {
	s := newStream()
	s.closed = true
	return s
}

func (s *stream) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// fill copies r into the stream until EOF. A pty master reports EIO once the
// terminal's last user is gone: that is its EOF.
func (s *stream) fill(r io.Reader) {
	chunk := make([]byte, 32*1024)
	for {
		n, err := r.Read(chunk)
		if n > 0 {
			s.append(chunk[:n])
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, unix.EIO) {
				err = nil
			}
			s.finish(err)
			return
		}
	}
}

// append adds data, first waiting while the buffer is full, then while
// the agent's output budget is.
func (s *stream) append(p []byte) {
	s.mu.Lock()
	for len(s.buf) >= streamBufferBytes && !s.closed {
		ch := s.changed
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	closed := s.closed
	s.mu.Unlock()
	if closed || !s.budget.take(len(p), s.dropped) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.budget.give(len(p))
		return
	}
	s.buf = append(s.buf, p...)
	s.notifyLocked()
}

// drop closes the stream and discards what it holds: its process is
// forgotten, and no one reads it any more.
func (s *stream) drop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.budget.give(len(s.buf))
	s.buf, s.closed = nil, true
	select {
	case <-s.dropped:
	default:
		close(s.dropped)
	}
	s.notifyLocked()
}

// finish marks the stream closed; buffered data can still be read.
func (s *stream) finish(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.err = err
	s.notifyLocked()
}

// read returns up to max buffered bytes, blocking until there are some, or
// eof once the stream is closed and drained.
func (s *stream) read(ctx context.Context, max int) ([]byte, bool, error) {
	if max <= 0 {
		max = defaultReadBytes
	}
	max = min(max, maxReadBytes)
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.buf) == 0 {
		if s.closed {
			return nil, true, nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
			s.mu.Lock()
		case <-ctx.Done():
			s.mu.Lock()
			return nil, false, ctx.Err()
		}
	}
	n := min(max, len(s.buf))
	out := make([]byte, n)
	copy(out, s.buf)
	s.buf = s.buf[n:]
	if len(s.buf) == 0 {
		s.buf = nil
	}
	s.budget.give(n)
	s.notifyLocked()
	return out, false, nil
}

// stdin is the write side of a process's stdin. Writes take turns; Close
// waits, within a bound, for the write in progress, so that data written
// before CloseStdin reaches a process that reads it. A write that stays
// blocked (a process, or a child of it, holding stdin open and never
// reading) never holds Close up past that bound: Close then closes the
// pipe, which ends the write.
type stdin struct {
	w       io.WriteCloser
	turn    chan struct{} // holds a token while a write runs
	closing chan struct{} // closed by close
	once    sync.Once
}

func newStdin(w io.WriteCloser) *stdin {
	return &stdin{w: w, turn: make(chan struct{}, 1), closing: make(chan struct{})}
}

// stdinCloseWait bounds how long CloseStdin waits for a write in progress.
const stdinCloseWait = 2 * time.Second

// write writes p once the write before it is done. It is refused once
// stdin is closed, also while it waits for its turn: a terminal's stdin
// stays open at close, so a write stuck on it is not ended, and the
// writes after it must not queue behind it.
func (s *stdin) write(ctx context.Context, p []byte) (int, error) {
	if s == nil || s.w == nil {
		return 0, errNoStdin
	}
	select {
	case s.turn <- struct{}{}:
	case <-s.closing:
		return 0, errStdinClosed
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-s.turn }()
	select {
	case <-s.closing:
		return 0, errStdinClosed
	default:
	}
	return s.w.Write(p)
}

// close closes stdin once the write in progress ends, or after wait if it
// does not. Later writes are refused.
func (s *stdin) close(wait time.Duration) error {
	if s == nil || s.w == nil {
		return nil
	}
	first := false
	s.once.Do(func() { close(s.closing); first = true })
	if !first {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s.turn <- struct{}{}:
		defer func() { <-s.turn }()
	case <-t.C:
	}
	return s.w.Close()
}
