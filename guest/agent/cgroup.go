package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the cgroup hierarchy is mounted (a variable for
// tests). The guest mounts cgroup v2 there; the agent's tests run on hosts
// that may still have v1, whose per-controller hierarchies sit below it.
var cgroupRoot = "/sys/fs/cgroup"

// cgroupDir returns the directory of a container's cgroup (guest path, e.g.
// /c8s/<id>) that lists its processes: the unified hierarchy's, or on v1 the
// pids (else memory, else cpu) controller's. ok is false when the cgroup
// does not exist (any more).
func cgroupDir(cgroup string) (dir string, ok bool) {
	if cgroup == "" {
		return "", false
	}
	rel := filepath.Clean("/" + cgroup)
	for _, base := range []string{"", "pids", "memory", "cpu"} {
		d := filepath.Join(cgroupRoot, base, rel)
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			return d, true
		}
	}
	return "", false
}

// cgroupPids lists the processes of a cgroup and of its descendants,
// sorted. A cgroup that does not exist has none.
func cgroupPids(cgroup string) ([]int, error) {
	dir, ok := cgroupDir(cgroup)
	if !ok {
		return nil, nil
	}
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) { // removed while walking
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && pid > 0 {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the processes of cgroup %s: %w", cgroup, err)
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}

// signalCgroup sends sig to every process of the cgroup; processes that are
// already gone are skipped.
func signalCgroup(cgroup string, sig unix.Signal) error {
	pids, err := cgroupPids(cgroup)
	if err != nil {
		return err
	}
	self := os.Getpid()
	for _, pid := range pids {
		if pid == 1 || pid == self {
			// Never the agent (PID 1 in the VM), even if the cgroup was
			// made to hold it.
			continue
		}
		if err := signalMember(pid, cgroup, sig); err != nil {
			return fmt.Errorf("signal %d pid %d of cgroup %s: %w", sig, pid, cgroup, err)
		}
	}
	return nil
}

// signalMember sends sig to pid if it is a process of cgroup (or of a
// cgroup below it). A pid read from cgroup.procs may have been reaped since
// by the process's parent, which can be any process of the container, and
// given to a new process anywhere in the VM; so the process is held by a
// pidfd, its cgroup read, and the signal sent through the pidfd: a signal
// that succeeds proves the process was not reaped, so the cgroup read was
// its own. Gone or elsewhere: nothing is signalled.
func signalMember(pid int, cgroup string, sig unix.Signal) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(fd)
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return nil
		}
		return err
	}
	if !inCgroup(data, cgroup) {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("pidfd_send_signal: %w", err)
	}
	return nil
}

// inCgroup reports whether /proc/<pid>/cgroup content names cgroup or a
// cgroup below it in any hierarchy (the unified one, "0::/c8s/<id>", or on
// a v1 host a controller's).
func inCgroup(procCgroup []byte, cgroup string) bool {
	rel := filepath.Clean("/" + cgroup)
	for _, line := range strings.Split(string(procCgroup), "\n") {
		_, path, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if _, path, ok = strings.Cut(path, ":"); !ok {
			continue
		}
		if path == rel || strings.HasPrefix(path, rel+"/") {
			return true
		}
	}
	return false
}

// killCgroup kills every process left in a container's cgroup, as runc's
// shim does when a container's init exits: with cgroup.kill where the
// kernel has it (cgroup v2, Linux 5.14), else by signalling each process
// until none is left or timeout passes. Processes forked while it runs are
// caught by the next round.
func killCgroup(cgroup string, timeout time.Duration) error {
	dir, ok := cgroupDir(cgroup)
	if !ok {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		pids, err := cgroupPids(cgroup)
		if err != nil || len(pids) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still has %d process(es) after %s of SIGKILL", cgroup, len(pids), timeout)
		}
		if err := signalCgroup(cgroup, unix.SIGKILL); err != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
