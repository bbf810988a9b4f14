package attest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/guest/channel"
)

// ErrNoProvider is Detect's error when the guest has no TEE to produce
// evidence: not a confidential VM, and no sim TEE port. Detect returns it
// only for a guest whose kernel command line names no TEE; the agent then
// runs without attestation.
var ErrNoProvider = errors.New("no attestation provider in this guest")

// ErrTEEUnavailable is Detect's error when the TEE the kernel command line
// names (c8s.tee, guest/api/teeparam) has no provider in this guest: an
// snp guest without its SEV guest device, a tdx guest without its TDX
// guest device, a sim guest without the sim port. It is not ErrNoProvider:
// a VM started as a TEE never runs as one without, and the agent refuses
// what needs its policy rather than fall back to allow-all.
var ErrTEEUnavailable = errors.New("the TEE this VM was started as has no attestation provider")

// configfsDir is where configfs is mounted.
const configfsDir = "/sys/kernel/config"

// Detect returns the provider of the guest below root for the TEE tee,
// which the launcher fixes on the measured kernel command line (c8s.tee,
// see guest/api/teeparam). loadModules, when not nil, runs first: the
// boot code defers the TEE guest modules (sev-guest, tdx-guest, tsm)
// until attestation is first needed. On root "/", Detect mounts configfs
// on /sys/kernel/config if it is not mounted yet.
//
// Only the named TEE's providers are considered:
//
//   - snp: configfs-tsm with the SEV guest device, else sev-guest;
//   - tdx: configfs-tsm with the TDX guest device, else tdx-guest;
//   - sim: the sim TEE's port, which the host serves.
//
// So a host that breaks the SEV or TDX guest driver of a confidential VM
// gets ErrTEEUnavailable, never its own sim evidence or ErrNoProvider. An
// unknown tee is an error too.
//
// With tee "" (a VM started by a launcher that predates c8s.tee, or not by
// c8s) Detect tries, in order, configfs-tsm, sev-guest, tdx-guest and sim,
// and returns ErrNoProvider when none is there. Such a VM's measurement
// differs from every one the image manifest records for its TEE.
//
// configfs-tsm counts only together with a TEE guest device: the tsm
// module creates its report directory on any machine, but only the
// sev-guest and tdx-guest drivers, which also create their devices,
// register a provider that can fill a report.
func Detect(ctx context.Context, root, tee string, loadModules func()) (Provider, error) {
	p, err := detect(ctx, root, tee, loadModules)
	if err != nil || p.Name() == NameSim {
		return p, err
	}
	return withCCEL{Provider: p, path: filepath.Join(root, CCELPath)}, nil
}

func detect(ctx context.Context, root, tee string, loadModules func()) (Provider, error) {
	if tee != "" && !teeparam.Known(tee) {
		return nil, fmt.Errorf("%s=%s: unknown TEE; known TEEs are %s", teeparam.Key, tee, strings.Join(teeparam.Names, ", "))
	}
	if loadModules != nil {
		loadModules()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if tee == teeparam.Sim {
		if port, ok := channel.FindPort(root, SimPortName); ok {
			return NewSim(port), nil
		}
		return nil, fmt.Errorf("%w: this VM was started as sim (%s on its measured kernel command line), but it has no virtio-serial port %s for the sim TEE's secure processor: check that the launcher added it",
			ErrTEEUnavailable, teeparam.Format(tee), SimPortName)
	}
	var mountErr error
	if root == "/" {
		mountErr = mountConfigfs()
	}
	sev := filepath.Join(root, SEVGuestDevice)
	tdx := filepath.Join(root, TDXGuestDevice)
	tsm := isDir(filepath.Join(root, TSMReportDir))
	switch tee {
	case teeparam.SNP:
		return hardware(root, KindSNP, sev, tsm, NewSEVGuest, mountErr)
	case teeparam.TDX:
		return hardware(root, KindTDX, tdx, tsm, NewTDXGuest, mountErr)
	}
	hasSEV, hasTDX := exists(sev), exists(tdx)
	if tsm && (hasSEV || hasTDX) {
		return withTDReportOf(newConfigfsTSM(root, ""), tdx), nil
	}
	if hasSEV {
		return NewSEVGuest(sev), nil
	}
	if hasTDX {
		return NewTDXGuest(tdx), nil
	}
	if port, ok := channel.FindPort(root, SimPortName); ok {
		return NewSim(port), nil
	}
	err := fmt.Errorf("%w: looked for configfs-tsm (%s with a TEE guest driver), %s, %s and the sim TEE's virtio-serial port %s; "+
		"on SNP or TDX, check that the VM is confidential and the sev-guest, tdx-guest and tsm modules loaded; with tee = \"sim\", that the launcher added the %s port",
		ErrNoProvider, filepath.Join(root, TSMReportDir), sev, tdx, SimPortName, SimPortName)
	if mountErr != nil {
		err = fmt.Errorf("%w (and %v)", err, mountErr)
	}
	return nil, err
}

// hardware returns the provider of a guest started as the hardware TEE of
// evidence kind (KindSNP or KindTDX, spelt as the TEEs teeparam.SNP and
// teeparam.TDX), whose guest driver makes device:
// configfs-tsm when its report directory is there too, else the device.
// Without the device it fails with ErrTEEUnavailable.
func hardware[P Provider](root, kind, device string, tsm bool, newDevice func(string) P, mountErr error) (Provider, error) {
	if exists(device) {
		if tsm {
			return withTDReportOf(newConfigfsTSM(root, kind), filepath.Join(root, TDXGuestDevice)), nil
		}
		return newDevice(device), nil
	}
	driver := map[string]string{KindSNP: "sev-guest", KindTDX: "tdx-guest"}[kind]
	err := fmt.Errorf("%w: this VM was started as %s (%s on its measured kernel command line), but it has no %s (and so no configfs-tsm provider either): "+
		"check that the VM is confidential and the %s and tsm modules loaded; the guest does not fall back to the host-served sim TEE or to no TEE",
		ErrTEEUnavailable, kind, teeparam.Format(kind), device, driver)
	if mountErr != nil {
		err = fmt.Errorf("%w (and %v)", err, mountErr)
	}
	return nil, err
}

// withTDReportOf gives p's TDX evidence the TDREPORT read through the
// tdx-guest device at path, where the guest has it (configfs-tsm returns
// only the quote).
func withTDReportOf(p Provider, path string) Provider {
	if !exists(path) {
		return p
	}
	return withTDReport{Provider: p, tdx: NewTDXGuest(path)}
}

// newConfigfsTSM returns the configfs-tsm provider of the guest below root,
// expecting evidence of kind (any kind when "").
func newConfigfsTSM(root, kind string) *ConfigfsTSM {
	var p *ConfigfsTSM
	if root == "/" {
		p = NewConfigfsTSM(nil)
	} else {
		p = NewConfigfsTSM(rootedClient{root: root})
	}
	p.kind = kind
	return p
}

// mountConfigfs mounts configfs on /sys/kernel/config where the kernel has
// configfs (the directory exists) and it is not mounted yet.
func mountConfigfs() error {
	if !isDir(configfsDir) || isDir(filepath.Dir(TSMReportDir)) {
		return nil
	}
	err := unix.Mount("configfs", configfsDir, "configfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mount configfs on %s: %w", configfsDir, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}
