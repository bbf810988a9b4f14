// Package ociruntime drives the guest's OCI runtime through go-runc: crun
// by default, runc where the image has no crun (guest/boot picks it). Both
// take runc's command line, which is why "runc" below names the commands
// (`runc create`, `runc exec`, ...) whichever binary runs them. It creates,
// starts, execs, signals and deletes containers, sets up each process's
// stdio (pipes, or a pty received over a console socket) and claims the
// process's exit from the reaper. Failures carry the tail of the runtime's
// log.
package ociruntime

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/console"
	runc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/guest/reaper"
)

// Stdio says which standard streams a process gets.
type Stdio struct {
	Terminal, Stdin, Stdout, Stderr bool
}

// ProcessIO holds the agent's ends of a process's stdio. Unrequested streams
// are nil. With a terminal, Stdout and Stdin are the pty master and Console
// resizes it.
type ProcessIO struct {
	Stdin   io.WriteCloser
	Stdout  io.ReadCloser
	Stderr  io.ReadCloser
	Console console.Console

	pipes runc.IO
}

// Process is a created process.
type Process struct {
	Pid  int
	IO   *ProcessIO
	Exit <-chan reaper.Exit
}

// Runtime runs an OCI runtime with runc's command line (crun or runc) with
// one state root.
type Runtime struct {
	// Command is the runtime binary (/usr/bin/crun in the guest); empty
	// means runc from PATH.
	Command string
	// SpecVersion, when set, is the ociVersion written into bundles: the
	// newest spec version Command accepts.
	SpecVersion string
	// Root is the runtime's state root (--root).
	Root   string
	Reaper *reaper.Reaper
}

// runcFor returns a runc client that logs to the bundle's log.json.
func (rt *Runtime) runcFor(bundle string) *runc.Runc {
	r := &runc.Runc{Command: rt.Command, Root: rt.Root}
	if bundle != "" {
		r.Log = filepath.Join(bundle, "log.json")
		r.LogFormat = runc.JSON
	}
	return r
}

// Create runs `runc create` for the bundle (whose config.json is written)
// and returns the container's init process, created but not started.
func (rt *Runtime) Create(ctx context.Context, id, bundle string, stdio Stdio, uid, gid int) (*Process, error) {
	r := rt.runcFor(bundle)
	pidFile := filepath.Join(bundle, "init.pid")
	sio, err := newStdio(stdio, uid, gid)
	if err != nil {
		return nil, fmt.Errorf("set up stdio of container %s: %w", id, err)
	}
	opts := &runc.CreateOpts{PidFile: pidFile, IO: sio.pipes}
	if sio.socket != nil {
		opts.ConsoleSocket = sio.socket
	}
	since := time.Now()
	if err := r.Create(ctx, id, bundle, opts); err != nil {
		sio.abort()
		return nil, rt.failure("create container "+id, bundle, err)
	}
	return rt.started(ctx, sio, pidFile, since)
}

// Exec runs `runc exec --detach` for an additional process of container id.
// Its pid file goes into the bundle, named after execID.
func (rt *Runtime) Exec(ctx context.Context, id, execID, bundle string, proc *specs.Process, stdio Stdio) (*Process, error) {
	r := rt.runcFor(bundle)
	pidFile := filepath.Join(bundle, "exec-"+safeName(execID)+".pid")
	sio, err := newStdio(stdio, int(proc.User.UID), int(proc.User.GID))
	if err != nil {
		return nil, fmt.Errorf("set up stdio of exec %s in container %s: %w", execID, id, err)
	}
	opts := &runc.ExecOpts{PidFile: pidFile, Detach: true, IO: sio.pipes}
	if sio.socket != nil {
		opts.ConsoleSocket = sio.socket
	}
	since := time.Now()
	if err := r.Exec(ctx, id, *proc, opts); err != nil {
		sio.abort()
		return nil, rt.failure("exec "+execID+" in container "+id, bundle, err)
	}
	return rt.started(ctx, sio, pidFile, since)
}

// started reads the pid file of a process runc just created, claims its exit
// and collects its stdio.
func (rt *Runtime) started(ctx context.Context, sio *stdioSetup, pidFile string, since time.Time) (*Process, error) {
	pid, err := runc.ReadPidFile(pidFile)
	if err != nil {
		sio.abort()
		return nil, fmt.Errorf("read runc's pid file: %w", err)
	}
	// Nothing needs it any more; exec probes would pile them up.
	_ = os.Remove(pidFile)
	exit := rt.Reaper.Claim(pid, since)
	pio, err := sio.collect()
	if err != nil {
		return nil, err
	}
	return &Process{Pid: pid, IO: pio, Exit: exit}, nil
}

// Start runs `runc start`.
func (rt *Runtime) Start(ctx context.Context, id, bundle string) error {
	if err := rt.runcFor(bundle).Start(ctx, id); err != nil {
		return rt.failure("start container "+id, bundle, err)
	}
	return nil
}

// Kill runs `runc kill`, to every process of the container with all.
func (rt *Runtime) Kill(ctx context.Context, id, bundle string, sig int, all bool) error {
	if err := rt.runcFor(bundle).Kill(ctx, id, sig, &runc.KillOpts{All: all}); err != nil {
		return rt.failure(fmt.Sprintf("signal %d container %s", sig, id), bundle, err)
	}
	return nil
}

// Update runs `runc update --resources -`, changing the cgroup resources
// of a created or running container (crun reads "-" as its stdin too).
func (rt *Runtime) Update(ctx context.Context, id, bundle string, resources *specs.LinuxResources) error {
	if err := rt.runcFor(bundle).Update(ctx, id, resources); err != nil {
		return rt.failure("update container "+id, bundle, err)
	}
	return nil
}

// Delete runs `runc delete --force`, killing whatever still runs.
func (rt *Runtime) Delete(ctx context.Context, id, bundle string) error {
	if err := rt.runcFor(bundle).Delete(ctx, id, &runc.DeleteOpts{Force: true}); err != nil {
		return rt.failure("delete container "+id, bundle, err)
	}
	return nil
}

// Exists reports whether the runtime knows the container: its state
// file under Root, runc's state.json or crun's status.
func (rt *Runtime) Exists(ctx context.Context, id string) bool {
	for _, f := range []string{"state.json", "status"} {
		if _, err := os.Stat(filepath.Join(rt.Root, id, f)); err == nil {
			return true
		}
	}
	return false
}

// failure wraps a runc error with the tail of the bundle's runc log.
func (rt *Runtime) failure(what, bundle string, err error) error {
	if tail := LogTail(filepath.Join(bundle, "log.json"), 3); tail != "" {
		return fmt.Errorf("runc: %s: %w (runc log: %s)", what, err, tail)
	}
	return fmt.Errorf("runc: %s: %w", what, err)
}

// LogTail returns the last n warning-or-worse messages of a JSON runc log,
// joined with "; ", or "" if there are none.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var msgs []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		line := sc.Bytes()
		if json.Unmarshal(line, &entry) != nil {
			if s := strings.TrimSpace(string(line)); s != "" {
				msgs = append(msgs, s)
			}
			continue
		}
		switch entry.Level {
		case "warning", "error", "fatal", "panic":
			msgs = append(msgs, entry.Msg)
		}
	}
	if len(msgs) > n {
		msgs = msgs[len(msgs)-n:]
	}
	return strings.Join(msgs, "; ")
}

func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == 0 {
			return '_'
		}
		return r
	}, s)
}
