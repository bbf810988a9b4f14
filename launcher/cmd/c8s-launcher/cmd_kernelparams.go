package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
)

func init() {
	register("kernel-params", "print the kernel parameters every pod VM boots with, before the root's, the TEE's and hypervisor.kernel_params; "+
		"with -tee, that TEE's own (images/build.sh builds and measures each TEE's command line from them)", runKernelParams)
}

func runKernelParams(_ context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("kernel-params")
	teeName := fs.String("tee", "", "print only the parameters TEE `NAME` ("+strings.Join(tee.Names(), ", ")+") adds, after the root's: c8s.tee=NAME")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return errors.New("usage: c8s-launcher kernel-params [-tee NAME]")
	}
	params := vm.BaseKernelParams
	if *teeName != "" {
		b, err := tee.Lookup(*teeName)
		if err != nil {
			return err
		}
		params = strings.Join(b.KernelParams(), " ")
	}
	_, err := fmt.Fprintln(stdout, params)
	return err
}
