package agent

import (
	"context"
	"errors"
	"io"
	"sync"

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
)

// stream buffers one output stream of a process from the moment the process
// is created, so nothing is lost if the process exits before the host reads.
type stream struct {
	mu     sync.Mutex
	buf    []byte
	closed bool
	err    error
	// changed is closed and replaced whenever buf or closed changes.
	changed chan struct{}
}

func newStream() *stream {
	return &stream{changed: make(chan struct{})}
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

// append adds data, first waiting while the buffer is full.
func (s *stream) append(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.buf) >= streamBufferBytes && !s.closed {
		ch := s.changed
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	if s.closed {
		return
	}
	s.buf = append(s.buf, p...)
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
	s.notifyLocked()
	return out, false, nil
}

// stdin is the write side of a process's stdin. Close waits for writes in
// progress, so data written before CloseStdin reaches the process.
type stdin struct {
	mu     sync.Mutex
	w      io.WriteCloser
	closed bool
}

func (s *stdin) write(p []byte) (int, error) {
	if s == nil {
		return 0, errNoStdin
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w == nil {
		return 0, errNoStdin
	}
	if s.closed {
		return 0, errStdinClosed
	}
	return s.w.Write(p)
}

func (s *stdin) close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w == nil || s.closed {
		return nil
	}
	s.closed = true
	return s.w.Close()
}
