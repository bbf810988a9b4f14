package attest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/guest/channel"
)

// ErrNoProvider is Detect's error when the guest has no TEE to produce
// evidence: not a confidential VM, and no sim TEE port.
var ErrNoProvider = errors.New("no attestation provider in this guest")

// configfsDir is where configfs is mounted.
const configfsDir = "/sys/kernel/config"

// Detect returns the provider the guest below root actually has, trying in
// order configfs-tsm, sev-guest, tdx-guest and sim. loadModules, when not
// nil, runs first: the boot code defers the TEE guest modules (sev-guest,
// tdx-guest, tsm) until attestation is first needed. On root "/", Detect
// mounts configfs on /sys/kernel/config if it is not mounted yet.
//
// configfs-tsm counts only together with a TEE guest device: the tsm
// module creates its report directory on any machine, but only the
// sev-guest and tdx-guest drivers, which also create their devices,
// register a provider that can fill a report.
func Detect(ctx context.Context, root string, loadModules func()) (Provider, error) {
	if loadModules != nil {
		loadModules()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var mountErr error
	if root == "/" {
		mountErr = mountConfigfs()
	}
	sev := filepath.Join(root, SEVGuestDevice)
	tdx := filepath.Join(root, TDXGuestDevice)
	hasSEV, hasTDX := exists(sev), exists(tdx)
	if isDir(filepath.Join(root, TSMReportDir)) && (hasSEV || hasTDX) {
		if root == "/" {
			return NewConfigfsTSM(nil), nil
		}
		return NewConfigfsTSM(rootedClient{root: root}), nil
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
