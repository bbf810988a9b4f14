// Command mkmanifest writes manifest.json for a guest image directory built by
// images/build.sh: it hashes the kernel and initramfs and records the version
// information passed as flags. The schema is defined by package
// github.com/c8s-dev/c8s/manifest.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/c8s-dev/c8s/manifest"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkmanifest:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkmanifest", flag.ContinueOnError)
	dir := fs.String("dir", "", "image directory (required); manifest.json is written there")
	kernel := fs.String("kernel", "vmlinuz", "kernel file name in -dir")
	initrd := fs.String("initrd", "initrd.img", "initramfs file name in -dir")
	m := manifest.Manifest{Schema: manifest.Schema}
	fs.StringVar(&m.Kernel.Package, "kernel-package", "", "Debian package of the kernel (required)")
	fs.StringVar(&m.Kernel.Version, "kernel-version", "", "version of -kernel-package (required)")
	fs.StringVar(&m.Kernel.Release, "kernel-release", "", "kernel release, uname -r (required)")
	fs.StringVar(&m.Runc.Package, "runc-package", "", "Debian package of runc")
	fs.StringVar(&m.Runc.Version, "runc-version", "", "version of -runc-package")
	fs.StringVar(&m.Cmdline, "cmdline", "", "the kernel command line every TEE shares, before the TEE's own parameters (required)")
	fs.StringVar(&m.AgentSHA256, "agent-sha256", "", "hex sha256 of the agent binary (required)")
	fs.Func("package", "NAME=VERSION of a Debian package in the image (repeatable)", func(v string) error {
		name, version, ok := strings.Cut(v, "=")
		if !ok || name == "" || version == "" {
			return fmt.Errorf("want NAME=VERSION, got %q", v)
		}
		m.Packages = append(m.Packages, manifest.Package{Package: name, Version: version})
		return nil
	})
	fs.Int64Var(&m.SourceDateEpoch, "source-date-epoch", 0, "timestamp of the initramfs files")
	simFirmware := fs.String("sim-firmware", "", "firmware `PATH` sim VMs boot; with it, the sim launch digests are recorded")
	simVCPUs := fs.String("sim-vcpus", "1,2,4,8", "vCPU counts to record sim digests for")
	simParams := fs.String("sim-params", "", "the sim TEE's kernel `PARAMS` (c8s-launcher kernel-params -tee sim), after -cmdline in its digests")
	tdxFirmware := fs.String("tdx-firmware", "", "TDVF `PATH`; with it, the TDX MRTD is recorded")
	tdxParams := fs.String("tdx-params", "", "the TDX TEE's kernel `PARAMS` (c8s-launcher kernel-params -tee tdx), after -cmdline in its RTMR2")
	var sealed sealedFlags
	sealed.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for name, v := range map[string]string{
		"-dir": *dir, "-kernel-package": m.Kernel.Package, "-kernel-version": m.Kernel.Version,
		"-kernel-release": m.Kernel.Release, "-cmdline": m.Cmdline, "-agent-sha256": m.AgentSHA256,
	} {
		if v == "" {
			return fmt.Errorf("flag %s is required", name)
		}
	}
	m.Artifacts = map[string]manifest.Artifact{}
	for role, name := range map[string]string{manifest.RoleKernel: *kernel, manifest.RoleInitrd: *initrd} {
		a, err := manifest.Describe(filepath.Join(*dir, name))
		if err != nil {
			return fmt.Errorf("describe %s: %w", role, err)
		}
		m.Artifacts[role] = a
	}
	if err := sealed.apply(&m, *dir, *kernel, *initrd); err != nil {
		return err
	}
	if *simFirmware != "" {
		cmdline, err := teeCmdline(m.Cmdline, "sim", *simParams)
		if err != nil {
			return err
		}
		d, err := simDigests(*simFirmware, filepath.Join(*dir, *kernel), filepath.Join(*dir, *initrd), cmdline, *simVCPUs)
		if err != nil {
			return err
		}
		if err := m.SetSim(d); err != nil {
			return err
		}
	}
	if *tdxFirmware != "" {
		cmdline, err := teeCmdline(m.Cmdline, "tdx", *tdxParams)
		if err != nil {
			return err
		}
		d, err := tdxDigests(*tdxFirmware, filepath.Join(*dir, *kernel), filepath.Join(*dir, *initrd), cmdline)
		if err != nil {
			return err
		}
		if err := m.SetTDX(d); err != nil {
			return err
		}
	}
	if err := m.Validate(); err != nil {
		return err
	}
	data, err := m.Marshal()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*dir, manifest.FileName), data, 0o644)
}
