// Package child starts the processes c8s supervises for as long as they
// run (QEMU, virtiofsd, the KVM probe's QEMU) so that they die with the
// process that started them: a shim that containerd kills must not leave
// a VM, a file server or a spinning probe behind.
package child

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// Running reports whether process pid runs: it exists and is not a
// zombie (which still answers signal 0 until its parent reaps it).
func Running(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The command (field 2) is in parentheses and may hold anything.
	i := bytes.LastIndexByte(data, ')')
	return i > 0 && i+2 < len(data) && data[i+2] != 'Z'
}

// StartTime returns the start time of process pid in clock ticks since
// boot (/proc/<pid>/stat field 22): with the pid, it names one process
// even after the pid is reused.
func StartTime(pid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command (field 2) is in parentheses and may hold anything.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// Start starts cmd in a process group of its own and runs supervise
// (which waits for it) in a goroutine. With dieWithParent the kernel kills
// cmd when its parent dies (PR_SET_PDEATHSIG). That signal follows the
// THREAD that forked cmd, not the process: the goroutine locks its thread
// for cmd's whole life, so no other goroutine can end that thread (a
// goroutine that exits locked takes its thread with it) and kill a healthy
// child.
func Start(cmd *exec.Cmd, dieWithParent bool, supervise func()) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !dieWithParent {
		if err := cmd.Start(); err != nil {
			return err
		}
		go supervise()
		return nil
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		supervise()
	}()
	return <-started
}
