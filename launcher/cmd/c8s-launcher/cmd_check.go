package main

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/admin/diag"
	"github.com/c8s-dev/c8s/launcher/config"
)

func init() {
	register("check", "check that this node can run c8s pod VMs (pass/warn/fail with hints; --json)", runCheck)
}

// errChecksFailed makes main exit non-zero after a report with a failed check.
var errChecksFailed = errors.New("at least one check failed")

// DefaultConfigPath is where the shim reads its configuration by default.
const DefaultConfigPath = "/etc/c8s/config.toml"

// loadNodeConfig loads path, or DefaultConfigPath under root when path is
// empty and that file exists, or else the built-in defaults. It returns
// the path it read ("" for defaults).
func loadNodeConfig(root, path string) (config.Config, string, error) {
	explicit := path != ""
	if !explicit {
		path = DefaultConfigPath
	}
	full := path
	if root != "" && root != "/" {
		full = root + path
	}
	if _, err := os.Stat(full); err != nil && !explicit {
		return config.Default(), "", nil
	}
	cfg, err := config.Load(full)
	if err != nil {
		return config.Config{}, "", err
	}
	return *cfg, path, nil
}

func runCheck(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("check")
	root := fs.String("root", "/", "filesystem root of the host to check (fixture trees, staging roots)")
	cfgPath := fs.String("config", "", "c8s configuration (default "+DefaultConfigPath+" if present, else built-in defaults)")
	teeName := fs.String("tee", "", "judge severities for this TEE: sim, snp or tdx (default: hypervisor.tee)")
	imageDir := fs.String("image-dir", "", "guest image directory with manifest.json (default: directory of hypervisor.kernel)")
	ctrdAddr := fs.String("containerd-address", diag.DefaultContainerdAddress, "containerd's gRPC socket")
	ctrdConfig := fs.String("containerd-config", "/etc/containerd/config.toml", "containerd's main config file")
	kubelet := fs.String("kubelet-socket", diag.DefaultKubeletSocket, "kubelet device plugin socket")
	noCache := fs.Bool("no-cache", false, "run the KVM probe even if a cached result exists, and do not cache it")
	asJSON := fs.Bool("json", false, "print the report as JSON (schema c8s.io/check/v1)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The KVM probe logs its verdict; the report already carries it.
	_ = log.SetLevel("warn")
	cfg, _, err := loadNodeConfig(*root, *cfgPath)
	if err != nil {
		return err
	}
	rep := diag.Run(ctx, diag.Options{
		Root:              *root,
		Config:            cfg,
		TEE:               *teeName,
		ImageDir:          *imageDir,
		ContainerdAddress: *ctrdAddr,
		ContainerdConfig:  *ctrdConfig,
		KubeletSocket:     *kubelet,
		NoCache:           *noCache,
	})
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if rep.Failed() {
		return errChecksFailed
	}
	return nil
}
