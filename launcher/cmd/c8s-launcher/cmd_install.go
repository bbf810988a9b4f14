package main

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"

	"github.com/c8s-dev/c8s/launcher/admin/install"
)

func init() {
	register("install", "install binaries, guest image and config, and register the c8s handlers in containerd", runInstall)
	register("uninstall", "undo c8s-launcher install (restores containerd's config)", runUninstall)
}

// installFlags declares the flags install and uninstall share.
func installFlags(fs *flag.FlagSet) (*install.Options, *int) {
	o := &install.Options{}
	fs.StringVar(&o.Root, "root", "/", "filesystem root to install into (a staging directory such as DESTDIR, or the host's root mounted in a pod)")
	fs.StringVar(&o.Prefix, "prefix", "/usr/local", "installation prefix: binaries in PREFIX/bin, the guest image in PREFIX/share/c8s")
	fs.StringVar(&o.SysconfDir, "sysconfdir", "/etc", "configuration directory: SYSCONFDIR/c8s/config.toml")
	fs.StringVar(&o.ContainerdConfig, "containerd-config", "", "containerd's main config (default SYSCONFDIR/containerd/config.toml)")
	fs.BoolVar(&o.Restart, "restart", false, "restart containerd (systemctl) when its config changed")
	version := fs.Int("containerd-config-version", 0, "version of a containerd config created when there is none: 2 (containerd 1.x) or 3 (2.x); default: from `containerd --version` (chrooted into --root), else 3")
	return o, version
}

func runInstall(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("install")
	o, version := installFlags(fs)
	exe, _ := os.Executable()
	fs.StringVar(&o.BinDir, "bin-dir", filepath.Dir(exe), "directory with the built binaries (default: this binary's directory)")
	fs.StringVar(&o.ImageDir, "image-dir", "", "directory with the built guest image and manifest.json (required; `make image` writes _output/image)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.ContainerdConfigVersion = *version
	if o.ContainerdConfigVersion == 0 {
		o.ContainerdConfigVersion = install.DetectConfigVersion(ctx, o.Root)
	}
	changes, err := install.Install(ctx, *o)
	if werr := install.WriteChanges(stdout, changes); err == nil {
		err = werr
	}
	return err
}

func runUninstall(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("uninstall")
	o, _ := installFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	changes, err := install.Uninstall(ctx, *o)
	if werr := install.WriteChanges(stdout, changes); err == nil {
		err = werr
	}
	return err
}
