package sandbox

import (
	"os"
	"testing"
)

// movedMachine is a pod VM that runs on another node now, whose QEMU pid
// is the destination's.
type movedMachine struct{ machine }

func (movedMachine) Pid() int { return 99 }

// After a live migration the pid the shim reports for the pod (to CRI,
// for containers created after the move) is this shim's, alive while it
// manages the pod, never the destination host's QEMU pid, which here
// names nothing or another process.
func TestPidAfterAMove(t *testing.T) {
	s := &Sandbox{vm: movedMachine{}}
	if got := s.Pid(); got != os.Getpid() {
		t.Fatalf("Pid after a move = %d, want the shim's %d (the destination's QEMU pid is %d)", got, os.Getpid(), s.machine().Pid())
	}
}
