package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
)

func init() {
	register("discover", "print the node's TEE capacity and the labels, taint and resources it would publish (JSON)", runDiscover)
}

// discoverOutput is what `c8s-launcher discover` prints.
type discoverOutput struct {
	Discovery discovery.Result `json:"discovery"`
	Desired   labels.Desired   `json:"desired"`
}

func runDiscover(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("discover")
	cfgPath := fs.String("config", "", "configuration file (TOML); default: built-in defaults")
	root := fs.String("root", "/", "filesystem root to read sysfs, procfs and /dev under")
	probe := fs.Bool("probe-kvm", false, "run (or reuse the cached) KVM probe with hypervisor.kernel, as hypervisor.accel = \"auto\" does")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, settings, err := loadAgentConfig(*cfgPath)
	if err != nil {
		return err
	}
	opts, err := nodeDiscoveryOptions(ctx, cfg, *root, *probe)
	if err != nil {
		return err
	}
	r, err := discovery.Discover(opts)
	if err != nil {
		return err
	}
	out, err := json.MarshalIndent(discoverOutput{Discovery: r, Desired: labels.Desire(r, settings)}, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", out)
	return err
}

// loadAgentConfig reads the c8s config at path (built-in defaults when
// empty) and its validated [node] settings.
func loadAgentConfig(path string) (config.Config, labels.Settings, error) {
	cfg := config.Default()
	if path != "" {
		c, err := config.Load(path)
		if err != nil {
			return cfg, labels.Settings{}, err
		}
		cfg = *c
	}
	settings, err := labels.SettingsFromConfig(cfg.Node)
	return cfg, settings, err
}

// nodeDiscoveryOptions returns the discovery options for the node: the
// config's choices, the filesystem root, and the KVM probe result when
// probe is set.
func nodeDiscoveryOptions(ctx context.Context, cfg config.Config, root string, probe bool) (discovery.Options, error) {
	opts := discovery.ConfigOptions(&cfg)
	opts.Root = root
	if !probe {
		return opts, nil
	}
	qemu, err := cfg.Hypervisor.QEMUBinary()
	if err != nil {
		return opts, err
	}
	res, err := accel.Choose(ctx, accel.Auto, qemu, cfg.Hypervisor.Kernel, cfg.CachePath())
	if err != nil {
		return opts, fmt.Errorf("KVM probe: %w", err)
	}
	opts.KVMProbe = &res
	return opts, nil
}
