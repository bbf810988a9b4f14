package main

import (
	"context"
	"io"

	"github.com/c8s-dev/c8s/launcher/admin/diag"
)

func init() {
	register("env", "print the effective configuration, versions and paths (TOML; --json)", runEnv)
}

func runEnv(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("env")
	root := fs.String("root", "/", "filesystem root of the host to describe")
	cfgPath := fs.String("config", "", "c8s configuration (default "+DefaultConfigPath+" if present, else built-in defaults)")
	imageDir := fs.String("image-dir", "", "guest image directory with manifest.json (default: directory of hypervisor.kernel)")
	ctrdAddr := fs.String("containerd-address", diag.DefaultContainerdAddress, "containerd's gRPC socket")
	ctrdConfig := fs.String("containerd-config", "/etc/containerd/config.toml", "containerd's main config file")
	asJSON := fs.Bool("json", false, "print JSON (schema "+diag.EnvSchema+") instead of TOML")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, used, err := loadNodeConfig(*root, *cfgPath)
	if err != nil {
		return err
	}
	env := diag.CollectEnv(ctx, diag.Options{
		Root:              *root,
		Config:            cfg,
		ImageDir:          *imageDir,
		ContainerdAddress: *ctrdAddr,
		ContainerdConfig:  *ctrdConfig,
	}, used)
	if *asJSON {
		return env.WriteJSON(stdout)
	}
	return env.WriteTOML(stdout)
}
