package statedir

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PidFile, in a VM's state dir, holds its QEMU's pid (shim/sandbox writes
// it once QEMU runs).
const PidFile = "qemu.pid"

// QEMU returns the pid in state dir dir's PidFile and that process's
// arguments, if it is the VM's QEMU: a live process one of whose
// arguments names a file in dir (its QMP socket, its console log). The
// pid file of a QEMU that died names a pid the kernel may have given
// another process since, another pod's QEMU included, so the name of the
// executable proves nothing. A zombie has no arguments and counts as gone.
// procRoot is where the host's processes are, normally /proc.
func QEMU(procRoot, dir string) (pid int, args []string, ok bool) {
	data, err := os.ReadFile(filepath.Join(dir, PidFile))
	if err != nil {
		return 0, nil, false
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, nil, false
	}
	cmdline, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"))
	if err != nil || len(cmdline) == 0 {
		return pid, nil, false
	}
	prefix := filepath.Clean(dir) + string(filepath.Separator)
	for _, a := range bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0}) {
		args = append(args, string(a))
	}
	for _, a := range args {
		if strings.Contains(a, prefix) {
			return pid, args, true
		}
	}
	return pid, nil, false
}
