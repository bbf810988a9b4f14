package attest

import (
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// ServeVerdict is the whole of c8s-verify, the shim's short-lived
// evidence verifier (launcher/cmd/c8s-verify): one verdict.Request from
// stdin, decided by Decide, its verdict.Verdict on stdout, a refusal of
// the evidence included. The error is the exchange's: a request it cannot
// read, a verdict it cannot write. The shim verifies in that process
// rather than in itself so that go-sev-guest, go-tdx-guest, the x509
// chains and the collateral are never resident in a pod's shim (issue
// 18). When stdout is the process's file descriptor 1, it is kept for the
// verdict alone (reserveStdout).
func ServeVerdict(stdin io.Reader, stdout io.Writer) error {
	return ServeVerdictAt(stdin, stdout, nil)
}

// ServeVerdictAt is ServeVerdict with certificates and collateral judged
// at now() (nil: the current time), for recorded evidence in tests.
func ServeVerdictAt(stdin io.Reader, stdout io.Writer, now func() time.Time) error {
	out, err := reserveStdout(stdout)
	if err != nil {
		return err
	}
	return verdict.Serve(stdin, out, func(r *verdict.Request) *verdict.Verdict { return DecideAt(r, now) })
}

// reserveStdout keeps the process's stdout for the verdict alone: a
// library that prints (go-sev-guest and go-tdx-guest have loggers) would
// otherwise corrupt the JSON the shim reads. File descriptor 1 becomes a
// copy of stderr, and the verdict goes to a duplicate of the original.
// Any other writer (a test's) is returned as it is.
func reserveStdout(stdout io.Writer) (io.Writer, error) {
	f, ok := stdout.(*os.File)
	if !ok || f.Fd() != 1 {
		return stdout, nil
	}
	fd, err := syscall.Dup(1)
	if err != nil {
		return nil, fmt.Errorf("keeping stdout for the verdict: %w", err)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.Dup3(2, 1, 0); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("keeping stdout for the verdict: %w", err)
	}
	return os.NewFile(uintptr(fd), "verdict"), nil
}
