package ociruntime

import (
	"fmt"
	"io"

	runc "github.com/containerd/go-runc"
)

// stdioSetup is the stdio prepared for one runc create or exec: pipes for a
// process without a terminal, a console socket to receive the pty master for
// one with a terminal.
type stdioSetup struct {
	stdio  Stdio
	pipes  runc.IO
	socket *runc.Socket
}

func newStdio(stdio Stdio, uid, gid int) (*stdioSetup, error) {
	s := &stdioSetup{stdio: stdio}
	if stdio.Terminal {
		sock, err := runc.NewTempConsoleSocket()
		if err != nil {
			return nil, fmt.Errorf("create console socket: %w", err)
		}
		s.socket = sock
		return s, nil
	}
	if !stdio.Stdin && !stdio.Stdout && !stdio.Stderr {
		// /dev/null for all three. Leaving them unset would make go-runc
		// capture runc's output through a pipe the container inherits,
		// and wait for its EOF forever.
		null, err := runc.NewNullIO()
		if err != nil {
			return nil, fmt.Errorf("open /dev/null for stdio: %w", err)
		}
		s.pipes = null
		return s, nil
	}
	// All three pipes, whatever was asked for: go-runc captures runc's
	// output itself when neither stdout nor stderr is set, through a pipe
	// the container would inherit. Unrequested streams are closed (stdin)
	// or discarded (outputs) in collect.
	pipes, err := runc.NewPipeIO(uid, gid)
	if err != nil {
		return nil, fmt.Errorf("create stdio pipes: %w", err)
	}
	s.pipes = pipes
	return s, nil
}

// abort releases everything after a failed runc command.
func (s *stdioSetup) abort() {
	if s.pipes != nil {
		_ = s.pipes.Close()
	}
	if s.socket != nil {
		_ = s.socket.Close()
	}
}

// collect returns the agent's ends once runc has created the process. For a
// terminal it receives the pty master runc sent to the console socket.
func (s *stdioSetup) collect() (*ProcessIO, error) {
	if s.socket != nil {
		defer s.socket.Close()
		master, err := s.socket.ReceiveMaster()
		if err != nil {
			return nil, fmt.Errorf("receive the pty master from runc: %w", err)
		}
		pio := &ProcessIO{Console: master, Stdout: nopCloser{master}}
		if s.stdio.Stdin {
			pio.Stdin = nopWriteCloser{master}
		}
		return pio, nil
	}
	pio := &ProcessIO{pipes: s.pipes}
	if !s.stdio.Stdin && !s.stdio.Stdout && !s.stdio.Stderr {
		return pio, nil
	}
	// go-runc closed the child's write ends of stdout and stderr after
	// starting runc. The agent's copy of stdin's read end stays open until
	// Close; it does not keep the process from seeing EOF.
	if s.stdio.Stdin {
		pio.Stdin = s.pipes.Stdin()
	} else {
		_ = s.pipes.Stdin().Close()
	}
	pio.Stdout = requested(s.stdio.Stdout, s.pipes.Stdout())
	pio.Stderr = requested(s.stdio.Stderr, s.pipes.Stderr())
	return pio, nil
}

// requested returns r if the stream was asked for; otherwise it discards
// what the process writes there and returns nil.
func requested(asked bool, r io.ReadCloser) io.ReadCloser {
	if asked {
		return r
	}
	go func() { _, _ = io.Copy(io.Discard, r) }()
	return nil
}

// Close releases all of the agent's ends of the process's stdio.
func (p *ProcessIO) Close() error {
	var err error
	if p.pipes != nil {
		err = p.pipes.Close()
	}
	if p.Console != nil {
		if cerr := p.Console.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// nopCloser keeps the pty master open when a stream wrapper is closed; the
// master is closed through Console.
type nopCloser struct{ io.Reader }

func (nopCloser) Close() error { return nil }

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
