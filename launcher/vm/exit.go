package vm

import (
	"errors"
	"fmt"
	"strings"
)

// ErrVsockCIDInUse is reported (through errors.Is) by a start that failed
// because QEMU could not take the vsock guest CID it was given: another VM
// on the host holds it. Start retries such a start with another CID.
var ErrVsockCIDInUse = errors.New("vm: the vsock guest CID is in use")

// ExitError says why QEMU exited: VM.Err returns one, and a start that
// QEMU did not survive wraps one.
type ExitError struct {
	// Pid is QEMU's process ID.
	Pid int
	// How is the exit status or the signal, in words.
	How string
	// Stderr is the tail of QEMU's output (stderr and stdout).
	Stderr string
	// Console is the tail of the guest's serial console.
	Console string
}

func (e *ExitError) Error() string {
	msg := fmt.Sprintf("qemu (pid %d) %s", e.Pid, e.How)
	if e.Stderr != "" {
		msg += "; qemu stderr:\n" + e.Stderr
	}
	if e.Console != "" {
		msg += "\nguest console:\n" + e.Console
	}
	return msg
}

// Is reports ErrVsockCIDInUse when QEMU's own output says the vsock guest
// CID could not be set ("vhost-vsock: unable to set guest cid: Address
// already in use"): QEMU gives no other sign of it.
func (e *ExitError) Is(target error) bool {
	return target == ErrVsockCIDInUse && strings.Contains(e.Stderr, "guest cid")
}
