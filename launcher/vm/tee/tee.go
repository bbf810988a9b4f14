// Package tee holds one backend per trusted execution environment (TEE) the
// launcher can start a pod VM in, and a registry to find them by the name
// used in hypervisor.tee.
//
// A backend contributes only its own pieces of the QEMU command line:
// machine options (confidential-guest-support, memory-backend), -object
// arguments (sev-snp-guest, tdx-guest, memory-backend-memfd), the firmware
// passed as -bios, extra kernel parameters, and the QEMU object types it
// needs. launcher/vm puts them together with the rest of the VM.
//
// Every backend's kernel parameters name its TEE (c8s.tee=<name>, see
// guest/api/teeparam). They are part of the launch measurement, so the
// guest can trust them to pick its attestation provider: a VM started as
// snp or tdx never takes the host-served sim evidence, and a missing TEE
// device fails closed. The image build measures each TEE's command line
// with that TEE's parameters (c8s-launcher kernel-params -tee).
//
// The hardware TEEs, snp and tdx, live here, one file each. The sim TEE's
// backend lives in launcher/vm/tee/sim with the rest of its host side (the
// launch measurement and the simulated secure processor); launcher/vm
// imports it, so every user of vm can start a sim VM.
//
// Adding a TEE means adding one Backend implementation that calls Register
// from an init function.
package tee

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/c8s-dev/c8s/launcher/config"
)

// Backend is one TEE implementation.
type Backend interface {
	// Name is the hypervisor.tee value selecting this backend.
	Name() string
	// KernelParams are the guest kernel parameters this TEE always adds:
	// the Pieces.KernelParams of every QEMU call, teeparam.Format(Name())
	// first. They depend on no setting, so that the image build can
	// measure them (c8s-launcher kernel-params -tee).
	KernelParams() []string
	// QEMU returns this backend's part of the QEMU command line for the
	// given (resolved) hypervisor configuration. It validates the
	// backend-specific settings and returns an error naming the bad key.
	QEMU(h config.Hypervisor) (Pieces, error)
}

// Pieces is what a backend adds to the QEMU command line.
type Pieces struct {
	// MachineOptions are appended to "-machine q35,..." (for example
	// "confidential-guest-support=snp0").
	MachineOptions []string
	// Args are complete extra arguments, e.g. "-object", "sev-snp-guest,...".
	Args []string
	// Firmware is passed as -bios when not empty.
	Firmware string
	// KernelParams are appended to the built-in guest kernel parameters
	// (and the root's): the backend's KernelParams().
	KernelParams []string
	// RequiresKVM is true when the TEE cannot run under TCG.
	RequiresKVM bool
	// QOMTypes are the QEMU object/device types this backend needs
	// ("sev-snp-guest", "tdx-guest", ...); see vm.CheckQEMUFeatures.
	QOMTypes []string
	// Ports are virtio-serial ports the backend needs besides the agent's,
	// by name (for example the sim TEE's "c8s.attest"); launcher/vm backs
	// each with a unix socket in the VM's state dir (see VM.DialPort).
	Ports []string
}

// KBSPort is the virtio-serial port on which the host relays byte streams
// from the guest to the key broker named in the pod's measured init data
// (launcher/broker Relay). Every TEE has it: the pod VM has no other network
// path to the broker, and TLS runs end to end from the guest.
const KBSPort = "c8s.kbs"

var (
	mu       sync.RWMutex
	backends = map[string]Backend{}
)

// Register makes a backend available under its Name. It is meant to be
// called from init functions; registering a name twice is a programming
// error reported by returning an error from Lookup of that name.
func Register(b Backend) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := backends[b.Name()]; dup {
		backends[b.Name()] = duplicate{name: b.Name()}
		return
	}
	backends[b.Name()] = b
}

// Lookup returns the backend registered under name.
func Lookup(name string) (Backend, error) {
	mu.RLock()
	defer mu.RUnlock()
	b, ok := backends[name]
	if !ok {
		return nil, fmt.Errorf("unknown TEE %q: known TEEs are %s", name, strings.Join(namesLocked(), ", "))
	}
	if d, ok := b.(duplicate); ok {
		return nil, fmt.Errorf("TEE %q is registered twice (programming error)", d.name)
	}
	return b, nil
}

// Names lists the registered backends, sorted.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	return namesLocked()
}

func namesLocked() []string {
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

type duplicate struct{ name string }

func (d duplicate) Name() string           { return d.name }
func (d duplicate) KernelParams() []string { return nil }
func (d duplicate) QEMU(config.Hypervisor) (Pieces, error) {
	return Pieces{}, fmt.Errorf("TEE %q is registered twice", d.name)
}
