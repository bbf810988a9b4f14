package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
)

func init() {
	register("probe-accel", "choose the accelerator (probing KVM for \"auto\") and print it", runProbeAccel)
}

func runProbeAccel(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("probe-accel")
	cfgPath := fs.String("config", "", "configuration file (TOML); default: built-in defaults")
	kernel := fs.String("kernel", "", "guest kernel to probe with (default: hypervisor.kernel)")
	mode := fs.String("accel", "", "auto, kvm or tcg (default: hypervisor.accel)")
	noCache := fs.Bool("no-cache", false, "probe even if a cached result exists, and do not cache")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := config.Default()
	if *cfgPath != "" {
		c, err := config.Load(*cfgPath)
		if err != nil {
			return err
		}
		cfg = *c
	}
	if *kernel == "" {
		*kernel = cfg.Hypervisor.Kernel
	}
	if *mode == "" {
		*mode = cfg.Hypervisor.Accel
	}
	if *kernel == "" && *mode == accel.Auto {
		return errors.New("no guest kernel to probe with: pass --kernel or --config with hypervisor.kernel")
	}
	qemu, err := cfg.Hypervisor.QEMUBinary()
	if err != nil {
		return err
	}
	cache := cfg.CachePath()
	if *noCache {
		cache = ""
	}
	res, err := accel.Choose(ctx, *mode, qemu, *kernel, cache)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "accel: %s\nreason: %s\ncached: %v\n", res.Accel, res.Reason, res.Cached)
	return nil
}
