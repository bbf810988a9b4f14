package sandbox

import "testing"

// movedMachine is a pod VM that runs on another node now, whose QEMU pid
// is the destination's.
type movedMachine struct{ machine }

func (movedMachine) Pid() int { return 99 }

// After a live migration the pid the shim reports for the pod (to CRI,
// for containers created after the move too) is the QEMU it booted in on
// this host, never the destination host's pid, which here names nothing
// or another process.
func TestPidAfterAMove(t *testing.T) {
	s := &Sandbox{hostPid: 4242, vm: movedMachine{}}
	if got := s.Pid(); got != 4242 {
		t.Fatalf("Pid after a move = %d, want this host's QEMU pid 4242 (the destination's is %d)", got, s.machine().Pid())
	}
}
