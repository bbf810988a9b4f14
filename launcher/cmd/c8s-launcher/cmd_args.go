package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
)

func init() {
	register("args", "print the QEMU argv for a configuration, one argument per line", runArgs)
}

func runArgs(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("args")
	cfgPath := fs.String("config", "", "configuration file (TOML)")
	id := fs.String("id", "example", "VM ID (names the state directory)")
	accelFlag := fs.String("accel", "", "kvm or tcg (default: hypervisor.accel; \"auto\" probes KVM)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cfgPath == "" {
		return errors.New("--config is required")
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	backend, err := tee.Lookup(cfg.Hypervisor.TEE)
	if err != nil {
		return err
	}
	mode := *accelFlag
	if mode == "" {
		mode = cfg.Hypervisor.Accel
	}
	qemu, err := cfg.Hypervisor.QEMUBinary()
	if err != nil {
		return err
	}
	res, err := accel.Choose(ctx, mode, qemu, cfg.Hypervisor.Kernel, cfg.CachePath())
	if err != nil {
		return err
	}
	root, err := vm.RootFor(cfg)
	if err != nil {
		return err
	}
	argv, err := vm.Args(vm.Spec{
		ID:         *id,
		StateDir:   statedir.Standalone(cfg.Runtime.StateDir, *id),
		Hypervisor: cfg.Hypervisor,
		Accel:      res.Accel,
		Root:       root,
	}, backend)
	if err != nil {
		return err
	}
	for _, a := range argv {
		fmt.Fprintln(stdout, a)
	}
	return nil
}
