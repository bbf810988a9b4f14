package initsys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// CorePattern is the guest's kernel.core_pattern: a pipe to a program
// that reads nothing, so that no core file is written anywhere. The
// kernel runs the program in the guest's own root, which containers do
// not write; the image does not even carry /bin/false, and a pipe to a
// program that does not exist dumps nothing either. (A file pattern would
// be opened in the crashing process's own mount namespace, where a
// container can place it on a disk or share the host reads.)
const CorePattern = "|/bin/false"

// coreSysctls are the sysctls DisableCoreDumps sets, by path under
// /proc/sys: no core files, and none of processes that changed
// credentials (fs.suid_dumpable 0).
var coreSysctls = [][2]string{
	{"kernel/core_pattern", CorePattern},
	{"fs/suid_dumpable", "0"},
}

// DisableCoreDumps keeps the guest from writing core dumps, whose memory
// images hold the pod's secrets: it sets the core dump sysctls under
// procSys (the guest: /proc/sys) and PID 1's RLIMIT_CORE to 0, which
// every process it starts inherits (the agent also gives each container
// and exec RLIMIT_CORE 0, guest/spec). A kernel built without core dump
// support has no core_pattern, which is as good.
func DisableCoreDumps(procSys string) error {
	for _, s := range coreSysctls {
		p := filepath.Join(procSys, s[0])
		err := writeExisting(p, s[1])
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("disable core dumps: set %s to %q: %w", p, s[1], err)
		}
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("disable core dumps: RLIMIT_CORE 0: %w", err)
	}
	return nil
}

// writeExisting writes value to the file at p, which must exist.
func writeExisting(p, value string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(value); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
