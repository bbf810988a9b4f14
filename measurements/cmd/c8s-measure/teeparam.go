package main

import (
	"fmt"
	"io"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
)

// appendHelp is the help of --append for the c8s TEEs' subcommands.
const appendHelp = "kernel command line (with --kernel); a c8s pod VM's ends in its TEE's c8s.tee=sim|snp|tdx: " +
	"give the image manifest's digests.<tee>.cmdline, or its cmdline followed by `c8s-launcher kernel-params -tee <tee>`"

// noteTEEParam warns on stderr when the digest of c8s TEE tee is computed
// over a kernel command line that does not name tee. The launcher fixes a
// pod VM's TEE on its measured command line (c8s.tee=<tee>, see
// guest/api/teeparam) and the guest picks its attestation provider by it,
// so such a digest matches no c8s pod VM of that TEE. Only a note: the
// command measures VMs that are not c8s pods too.
func noteTEEParam(stderr io.Writer, tee, cmdline string) {
	got, ok, err := teeparam.FromCmdline(cmdline)
	var why string
	switch {
	case err != nil:
		why = err.Error()
	case !ok:
		why = "it does not name the TEE"
	case got != tee:
		why = fmt.Sprintf("it names %s", teeparam.Format(got))
	default:
		return
	}
	fmt.Fprintf(stderr, "c8s-measure %s: note: --append %q: %s; a c8s %s pod VM's command line ends in %s (c8s-launcher kernel-params -tee %s; the image manifest's digests.%s.cmdline), so this digest matches no c8s pod\n",
		tee, cmdline, why, tee, teeparam.Format(tee), tee, tee)
}
