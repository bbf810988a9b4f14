package vm

import (
	"errors"
	"fmt"
	"testing"
)

// TestExitErrorVsockCIDInUse checks that a start QEMU did not survive
// because its vsock CID was taken is told apart by type, through the
// wrapping Start adds, and that other exits are not.
func TestExitErrorVsockCIDInUse(t *testing.T) {
	taken := &ExitError{Pid: 42, How: "exited with status 1",
		Stderr: "qemu-system-x86_64: -device vhost-vsock-pci,guest-cid=77: vhost-vsock: unable to set guest cid: Address already in use"}
	err := fmt.Errorf("vm: qemu exited before QMP was ready: %w", taken)
	if !errors.Is(err, ErrVsockCIDInUse) {
		t.Fatalf("%v: not ErrVsockCIDInUse", err)
	}
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Pid != 42 {
		t.Fatalf("errors.As(%v) = %+v, want the ExitError", err, ee)
	}
	for _, other := range []*ExitError{
		{Pid: 42, How: "exited with status 1", Stderr: "qemu-system-x86_64: -accel kvm: failed to initialize kvm"},
		// Only QEMU's own output counts, not what the guest printed.
		{Pid: 42, How: "was killed by signal killed", Console: "guest cid"},
	} {
		if errors.Is(fmt.Errorf("vm: %w", other), ErrVsockCIDInUse) {
			t.Errorf("%v: reported as ErrVsockCIDInUse", other)
		}
	}
}

// TestExitErrorMessage checks the message VM.Err and failed starts show.
func TestExitErrorMessage(t *testing.T) {
	for _, c := range []struct {
		e    ExitError
		want string
	}{
		{ExitError{Pid: 7, How: "exited with status 1"}, "qemu (pid 7) exited with status 1"},
		{ExitError{Pid: 7, How: "exited with status 1", Stderr: "bad -device"}, "qemu (pid 7) exited with status 1; qemu stderr:\nbad -device"},
		{ExitError{Pid: 7, How: "was killed by signal killed", Stderr: "out", Console: "Kernel panic"},
			"qemu (pid 7) was killed by signal killed; qemu stderr:\nout\nguest console:\nKernel panic"},
		{ExitError{Pid: 7, How: "exited with status 0", Console: "reboot"}, "qemu (pid 7) exited with status 0\nguest console:\nreboot"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("Error() = %q, want %q", got, c.want)
		}
	}
}
