// Package reaper collects the exits of every child of c8s-agent.
//
// Inside the VM the agent is PID 1, so every orphan in the guest becomes its
// child; on a development host the agent marks itself a child subreaper to
// get the same behaviour. The Reaper waits for all of them with
// wait4(-1, WNOHANG) on SIGCHLD and routes each exit to whoever wants it:
//
//   - commands started through the Reaper's runc.ProcessMonitor methods
//     (go-runc's own invocations of the OCI runtime, crun or runc, once
//     runc.Monitor is set to it);
//   - processes claimed by pid with Claim (container and exec processes,
//     whose pid is only known after the runtime has written its pid file).
//
// Exits nobody has claimed yet are kept, so a process that exits before its
// pid is claimed is never missed.
package reaper

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"sync"
	"time"

	runc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"
)

// Unclaimed exits are remembered until they are claimed, and swept once
// maxUnclaimed of them pile up (orphans nobody ever claims: daemons'
// grandchildren). A sweep drops only those older than unclaimedKeep: a
// process's exit is claimed within moments of the runtime naming its pid,
// and one dropped before then would leave its claim waiting, and Signal
// free to hit the next process given the pid. Younger ones are kept
// whatever their number: they are keyed by pid, so the VM's pid space
// (pid_max: 32768 in a pod VM of up to 32 vCPUs) bounds them.
const (
	maxUnclaimed  = 4096
	unclaimedKeep = 2 * time.Minute
)

// Exit is one reaped child.
type Exit struct {
	Pid int
	// Status is the exit code, or 128+signal for a process killed by a signal.
	Status int
	// Timestamp is when the exit was reaped.
	Timestamp time.Time
}

// Reaper routes child exits. Its zero value is not usable; call New.
type Reaper struct {
	mu        sync.Mutex
	commands  map[int]chan runc.Exit
	claims    map[int][]chan Exit
	unclaimed map[int]Exit
	// sweepAt is the number of unclaimed exits that starts a sweep
	// (at least maxUnclaimed).
	sweepAt int
	sigs    chan os.Signal
	stop    chan struct{}
	stopped chan struct{}
}

// New installs the SIGCHLD handler and starts reaping. When the process is
// not PID 1 it becomes a child subreaper so that orphaned descendants (such as
// container processes after the OCI runtime exits) are reparented to it.
func New() (*Reaper, error) {
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, &os.SyscallError{Syscall: "prctl(PR_SET_CHILD_SUBREAPER)", Err: err}
		}
	}
	r := &Reaper{
		commands:  map[int]chan runc.Exit{},
		claims:    map[int][]chan Exit{},
		unclaimed: map[int]Exit{},
		sigs:      make(chan os.Signal, 32),
		stop:      make(chan struct{}),
		stopped:   make(chan struct{}),
	}
	signal.Notify(r.sigs, unix.SIGCHLD)
	go r.loop()
	return r, nil
}

// Close stops reaping. Children exiting afterwards stay zombies.
func (r *Reaper) Close() {
	signal.Stop(r.sigs)
	close(r.stop)
	<-r.stopped
}

func (r *Reaper) loop() {
	defer close(r.stopped)
	// Children may have exited before the handler was installed.
	r.reap()
	for {
		select {
		case <-r.stop:
			return
		case <-r.sigs:
			r.reap()
		}
	}
}

// reap collects every exited child without blocking. Each wait and the
// dispatch of its exit happen under mu, so Signal never sees a pid that
// has been reaped (and may have been reused) as still claimed.
func (r *Reaper) reap() {
	for r.reapOne() {
	}
}

// reapOne reaps at most one child; it reports whether to go on.
func (r *Reaper) reapOne() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ws unix.WaitStatus
	pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
	if errors.Is(err, unix.EINTR) {
		return true
	}
	if err != nil || pid <= 0 {
		return false
	}
	if ws.Exited() || ws.Signaled() { // not stopped or continued
		r.dispatchLocked(Exit{Pid: pid, Status: ExitStatus(ws), Timestamp: time.Now()})
	}
	return true
}

// Signal sends sig to pid only while claim, the channel Claim returned
// for it, still waits for its exit: until the reaper waits for the process,
// its pid cannot name another one, even when it has exited (a zombie).
// Otherwise it fails with ESRCH and nothing is signalled: once reaped, the
// kernel may have given the number to any new process of the VM, one that
// another claim now waits for included.
func (r *Reaper) Signal(pid int, claim <-chan Exit, sig unix.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pid <= 0 || !slices.ContainsFunc(r.claims[pid], func(c chan Exit) bool { return c == claim }) {
		return unix.ESRCH
	}
	return unix.Kill(pid, sig)
}

// ExitStatus converts a wait status to a shell-style exit status: the exit
// code, or 128+signal for a process killed by a signal.
func ExitStatus(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

func (r *Reaper) dispatchLocked(e Exit) {
	if ch, ok := r.commands[e.Pid]; ok {
		delete(r.commands, e.Pid)
		ch <- runc.Exit{Pid: e.Pid, Status: e.Status, Timestamp: e.Timestamp}
		close(ch)
		return
	}
	if chs, ok := r.claims[e.Pid]; ok {
		delete(r.claims, e.Pid)
		for _, ch := range chs {
			ch <- e
			close(ch)
		}
		return
	}
	if len(r.unclaimed) >= max(r.sweepAt, maxUnclaimed) {
		r.sweepLocked(e.Timestamp)
	}
	r.unclaimed[e.Pid] = e
}

// sweepLocked drops the unclaimed exits older than unclaimedKeep at now,
// and sets the size of the next sweep: twice what is left, so that
// exits arriving faster than they age cost no scan each.
func (r *Reaper) sweepLocked(now time.Time) {
	for pid, e := range r.unclaimed {
		if now.Sub(e.Timestamp) > unclaimedKeep {
			delete(r.unclaimed, pid)
		}
	}
	r.sweepAt = 2 * len(r.unclaimed)
}

// Claim returns a channel that receives the exit of pid exactly once. An
// exit of pid reaped at or after since, before the claim, is delivered at
// once; older unclaimed exits of the same pid belong to an earlier process
// that had that pid and are discarded. Callers pass the time just before they
// started the command that created the process.
func (r *Reaper) Claim(pid int, since time.Time) <-chan Exit {
	ch := make(chan Exit, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.unclaimed[pid]; ok {
		delete(r.unclaimed, pid)
		if !e.Timestamp.Before(since) {
			ch <- e
			close(ch)
			return ch
		}
	}
	r.claims[pid] = append(r.claims[pid], ch)
	return ch
}

// Start starts c and returns the channel its exit will be sent on. It
// implements runc.ProcessMonitor.
func (r *Reaper) Start(c *exec.Cmd) (chan runc.Exit, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Holding the lock across Start means the exit cannot be dispatched
	// before the command is registered.
	if err := c.Start(); err != nil {
		return nil, err
	}
	ch := make(chan runc.Exit, 1)
	r.commands[c.Process.Pid] = ch
	return ch, nil
}

// StartLocked is Start with the starting goroutine locked to its OS thread,
// for commands that use Pdeathsig. It implements runc.ProcessMonitor.
func (r *Reaper) StartLocked(c *exec.Cmd) (chan runc.Exit, error) {
	type result struct {
		ch  chan runc.Exit
		err error
	}
	done := make(chan result)
	go func() {
		// The thread stays locked until the goroutine ends; ending a
		// locked goroutine retires its thread, which would deliver the
		// parent-death signal, so keep it parked until the command exits.
		runtime.LockOSThread()
		ch, err := r.Start(c)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		relay := make(chan runc.Exit, 1)
		done <- result{ch: relay}
		e := <-ch
		runtime.UnlockOSThread()
		relay <- e
		close(relay)
	}()
	res := <-done
	return res.ch, res.err
}

// Wait waits for the exit of a command started with Start and releases the
// command's resources. It implements runc.ProcessMonitor.
func (r *Reaper) Wait(c *exec.Cmd, ec chan runc.Exit) (int, error) {
	e, ok := <-ec
	// The child is already reaped, so c.Wait fails with ECHILD; it is called
	// for its side effects: waiting for the goroutines that copy the
	// command's output and closing its pipes.
	_ = c.Wait()
	if !ok {
		return -1, errors.New("reaper: exit channel closed without an exit")
	}
	return e.Status, nil
}

// Run starts c through the reaper, waits for it and returns its exit status.
// Code that runs commands while a Reaper is active must use this (or go-runc
// with runc.Monitor set to the Reaper) instead of c.Run, whose wait would race
// with the reaper.
func (r *Reaper) Run(c *exec.Cmd) (int, error) {
	ec, err := r.Start(c)
	if err != nil {
		return -1, err
	}
	return r.Wait(c, ec)
}
