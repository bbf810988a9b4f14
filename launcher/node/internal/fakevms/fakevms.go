// Package fakevms lays out, for tests, pod VMs as the node agent finds
// them: a state directory with the QEMU pid file the shim writes, and a
// /proc fixture entry whose command line is the one launcher/vm gives
// that VM's QEMU.
package fakevms

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
)

// Cmdline is the NUL-separated command line launcher/vm gives the QEMU of
// a pod VM of TEE teeName ("snp", "tdx", "sim") whose state is in stateDir.
func Cmdline(tb testing.TB, teeName, stateDir string) []byte {
	tb.Helper()
	h := config.Default().Hypervisor
	h.TEE = teeName
	h.Kernel, h.Initrd, h.Firmware = "/k", "/i", "/f"
	b, err := tee.Lookup(teeName)
	if err != nil {
		tb.Fatal(err)
	}
	argv, err := vm.Args(vm.Spec{ID: filepath.Base(stateDir), StateDir: stateDir, Hypervisor: h, Accel: "kvm"}, b)
	if err != nil {
		tb.Fatal(err)
	}
	return []byte(strings.Join(argv, "\x00") + "\x00")
}

// WriteFile creates path with data, and its parent directories.
func WriteFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		tb.Fatal(err)
	}
}

// Start lays out a running pod VM of teeName in stateDir whose QEMU has
// pid under procRoot.
func Start(tb testing.TB, stateDir, procRoot string, pid int, teeName string) {
	tb.Helper()
	WriteFile(tb, filepath.Join(stateDir, "console.log"), nil)
	WriteFile(tb, filepath.Join(stateDir, statedir.PidFile), []byte(strconv.Itoa(pid)))
	WriteFile(tb, filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"), Cmdline(tb, teeName, stateDir))
}

// Exit makes pid's process gone from procRoot; the VM's state directory
// stays, as after a shim crash.
func Exit(tb testing.TB, procRoot string, pid int) {
	tb.Helper()
	if err := os.RemoveAll(filepath.Join(procRoot, strconv.Itoa(pid))); err != nil {
		tb.Fatal(err)
	}
}
