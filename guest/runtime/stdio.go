package runtime

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
		return s, nil
	}
	pipes, err := runc.NewPipeIO(uid, gid, func(o *runc.IOOption) {
		o.OpenStdin, o.OpenStdout, o.OpenStderr = stdio.Stdin, stdio.Stdout, stdio.Stderr
	})
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
	if s.pipes == nil {
		return pio, nil
	}
	// go-runc closed the child's write ends of stdout and stderr after
	// starting runc. The agent's copy of stdin's read end stays open until
	// Close; it does not keep the process from seeing EOF.
	if in := s.pipes.Stdin(); in != nil {
		pio.Stdin = in
	}
	if out := s.pipes.Stdout(); out != nil {
		pio.Stdout = out
	}
	if errR := s.pipes.Stderr(); errR != nil {
		pio.Stderr = errR
	}
	return pio, nil
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
