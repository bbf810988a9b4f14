// Command c8s-verify is the shim's evidence verifier: the shim runs
// `c8s-verify verify-evidence` for every attestation of a pod VM, writes
// one request (launcher/attest/verdict) on its stdin and reads the
// verdict on its stdout (attest.ServeVerdict). It is a binary of its own,
// linking only launcher/attest and the standard library, so that it
// starts in a few milliseconds; `c8s-launcher verify-report` is the same
// verification for people.
package main

import (
	"fmt"
	"os"

	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] != verdict.Subcommand {
		fmt.Fprintf(os.Stderr, "usage: c8s-verify %s <request.json >verdict.json\n"+
			"c8s-verify is run by the shim; to verify a pod's evidence yourself, use c8s-launcher verify-report\n", verdict.Subcommand)
		os.Exit(2)
	}
	if err := attest.ServeVerdict(os.Stdin, os.Stdout); err != nil {
		// verdict.Helper.Decide reports what follows "verify-evidence: ".
		fmt.Fprintf(os.Stderr, "c8s-verify %s: %v\n", verdict.Subcommand, err)
		os.Exit(1)
	}
}
