package reaper

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// One Reaper per test binary: it owns SIGCHLD and wait4(-1).
var testReaper *Reaper

func TestMain(m *testing.M) {
	r, err := New()
	if err != nil {
		panic(err)
	}
	testReaper = r
	code := m.Run()
	r.Close()
	os.Exit(code)
}

func TestRunReportsStatusAndOutput(t *testing.T) {
	var out bytes.Buffer
	c := exec.Command("/bin/sh", "-c", "echo hello; exit 7")
	c.Stdout = &out
	status, err := testReaper.Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if status != 7 {
		t.Errorf("status = %d, want 7", status)
	}
	if out.String() != "hello\n" {
		t.Errorf("output = %q, want %q (Wait must drain the copy goroutine)", out.String(), "hello\n")
	}
}

func TestSignalledStatusIs128PlusSignal(t *testing.T) {
	c := exec.Command("/bin/sh", "-c", "kill -TERM $$")
	status, err := testReaper.Run(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := 128 + int(unix.SIGTERM); status != want {
		t.Errorf("status = %d, want %d", status, want)
	}
}

// orphan starts a shell that forks a grandchild in the background, prints
// its pid and exits at once. The grandchild is reparented to the test process
// (a subreaper), as container processes are after runc exits. It runs script
// only once release is called: had it exited while the shell still ran, the
// shell could have reaped it.
func orphan(t *testing.T, script string) (pid int, since time.Time, release func()) {
	t.Helper()
	gate := filepath.Join(t.TempDir(), "go")
	since = time.Now()
	var out bytes.Buffer
	c := exec.Command("/bin/sh", "-c", "(while [ ! -e "+gate+" ]; do sleep 0.02; done; "+script+") >/dev/null 2>&1 </dev/null & echo $!")
	c.Stdout = &out
	if status, err := testReaper.Run(c); err != nil || status != 0 {
		t.Fatalf("start orphan: status %d, err %v", status, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("orphan pid %q: %v", out.String(), err)
	}
	return pid, since, func() {
		if err := os.WriteFile(gate, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestClaimBeforeExit(t *testing.T) {
	pid, since, release := orphan(t, "exit 5")
	ch := testReaper.Claim(pid, since)
	select {
	case e := <-ch:
		t.Fatalf("exit %+v delivered before the process was allowed to exit", e)
	default:
	}
	release()
	e := <-ch
	if e.Pid != pid || e.Status != 5 {
		t.Errorf("exit = %+v, want pid %d status 5", e, pid)
	}
}

func TestClaimAfterExitIsNotMissed(t *testing.T) {
	pid, since, release := orphan(t, "exit 9")
	release()
	// Wait until the exit has been reaped and parked as unclaimed.
	waitUnclaimed(t, pid)
	e := <-testReaper.Claim(pid, since)
	if e.Pid != pid || e.Status != 9 {
		t.Errorf("exit = %+v, want pid %d status 9", e, pid)
	}
	testReaper.mu.Lock()
	_, still := testReaper.unclaimed[pid]
	testReaper.mu.Unlock()
	if still {
		t.Error("claimed exit is still kept as unclaimed")
	}
}

func TestStaleUnclaimedExitIsNotDelivered(t *testing.T) {
	pid, _, release := orphan(t, "exit 1")
	release()
	waitUnclaimed(t, pid)
	// A claim for a process started after that exit must not get it.
	ch := testReaper.Claim(pid, time.Now().Add(time.Hour))
	select {
	case e := <-ch:
		t.Fatalf("stale exit %+v delivered", e)
	default:
	}
	testReaper.mu.Lock()
	delete(testReaper.claims, pid)
	testReaper.mu.Unlock()
}

// Unclaimed exits are swept once they pile up, the old ones only: an
// exit not yet claimed because its process was just created is never
// dropped, however many orphans exit around it (its claim would wait
// forever, and Signal could hit the pid's next process).
func TestUnclaimedExitsAreBounded(t *testing.T) {
	r := &Reaper{commands: nil, claims: map[int][]chan Exit{}, unclaimed: map[int]Exit{}}
	base := time.Now()
	// Old orphans, then a burst of young ones around a container's init
	// (pid 7), each twice the sweep size.
	for i := range maxUnclaimed {
		r.dispatchLocked(Exit{Pid: 100000 + i, Timestamp: base})
	}
	at := base.Add(unclaimedKeep + time.Second)
	r.dispatchLocked(Exit{Pid: 7, Status: 3, Timestamp: at})
	for i := range 2 * maxUnclaimed {
		r.dispatchLocked(Exit{Pid: 200000 + i, Timestamp: at.Add(time.Duration(i) * time.Microsecond)})
	}
	if _, ok := r.unclaimed[100000]; ok {
		t.Error("an exit older than unclaimedKeep was kept past a sweep")
	}
	if n := len(r.unclaimed); n != 2*maxUnclaimed+1 {
		t.Errorf("kept %d unclaimed exits, want the %d young ones", n, 2*maxUnclaimed+1)
	}
	select {
	case e := <-r.Claim(7, at.Add(-time.Second)):
		if e.Status != 3 {
			t.Errorf("the young exit claimed late = %+v, want status 3", e)
		}
	default:
		t.Error("the young exit was dropped: its claim would wait forever")
	}
	// The sweeps are spaced by what they leave: not one per exit.
	if r.sweepAt < 2*maxUnclaimed {
		t.Errorf("next sweep at %d exits, want at least twice the young ones left", r.sweepAt)
	}
}

func TestSeveralClaimsOfOnePid(t *testing.T) {
	pid, since, release := orphan(t, "exit 4")
	a := testReaper.Claim(pid, since)
	b := testReaper.Claim(pid, since)
	release()
	for _, ch := range []<-chan Exit{a, b} {
		if e := <-ch; e.Status != 4 {
			t.Errorf("exit = %+v, want status 4", e)
		}
	}
}

func waitUnclaimed(t *testing.T, pid int) {
	t.Helper()
	for i := 0; ; i++ {
		testReaper.mu.Lock()
		_, ok := testReaper.unclaimed[pid]
		testReaper.mu.Unlock()
		if ok {
			return
		}
		if i > 1000 {
			t.Fatalf("exit of pid %d never reaped", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSignalReachesAClaimedProcess(t *testing.T) {
	pid, since, release := orphan(t, "sleep 100")
	ch := testReaper.Claim(pid, since)
	if err := testReaper.Signal(pid, ch, unix.SIGTERM); err != nil {
		t.Fatalf("Signal(claimed pid %d): %v", pid, err)
	}
	release()
	if e := <-ch; e.Status != 128+int(unix.SIGTERM) {
		t.Errorf("exit = %+v, want status %d", e, 128+int(unix.SIGTERM))
	}
}

// A pid the reaper holds no claim for, such as the number of a reaped
// process that the kernel gave to a new one, is never signalled.
func TestMaliciousHostSignalsAnUnclaimedPid(t *testing.T) {
	pid, since, release := orphan(t, "exit 3")
	// Another process's claim, still waiting: the number of this one, once
	// reaped, could be given to that one.
	other, otherSince, otherRelease := orphan(t, "exit 0")
	otherCh := testReaper.Claim(other, otherSince)
	if err := testReaper.Signal(pid, otherCh, unix.SIGKILL); err != unix.ESRCH {
		t.Errorf("Signal(unclaimed pid %d, another's claim) = %v, want ESRCH", pid, err)
	}
	ch := testReaper.Claim(pid, since)
	if err := testReaper.Signal(other, ch, unix.SIGKILL); err != unix.ESRCH {
		t.Errorf("Signal(pid %d with the claim of pid %d) = %v, want ESRCH", other, pid, err)
	}
	release()
	otherRelease()
	if e := <-ch; e.Status != 3 {
		t.Errorf("the unclaimed process was signalled: exit %+v, want status 3", e)
	}
	if e := <-otherCh; e.Status != 0 {
		t.Errorf("a process was signalled through another's claim: exit %+v, want status 0", e)
	}
	// Reaped: the number is free for any new process now.
	if err := testReaper.Signal(pid, ch, unix.SIGKILL); err != unix.ESRCH {
		t.Errorf("Signal(reaped pid %d) = %v, want ESRCH", pid, err)
	}
	if err := testReaper.Signal(0, ch, unix.SIGKILL); err != unix.ESRCH {
		t.Errorf("Signal(0) = %v, want ESRCH", err)
	}
}
