package sandbox

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/attest/simsp"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/simtee"
	"github.com/c8s-dev/c8s/launcher/tee"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// hostTEE is the host-side part of a TEE that needs one: the sim TEE's
// simulated secure processor. Hardware TEEs have none (the guest talks to
// the real secure processor).
type hostTEE interface {
	// prepare runs before QEMU starts, with the argv it will be given.
	prepare(argv []string) error
	// attach runs once QEMU is up; the service lives until ctx ends.
	attach(ctx context.Context, v *vm.VM) error
}

// hostTEEs maps hypervisor.tee to the constructor of its host part.
// hostData is the HOST_DATA the VM is launched with.
var hostTEEs = map[string]func(cfg config.Config, hostData [32]byte) hostTEE{
	"sim": func(cfg config.Config, hostData [32]byte) hostTEE {
		return &simHost{spDir: SimSPDir(cfg), hostData: hostData}
	},
}

// SimSPDir holds the node's simulated secure processor identity (its
// test-only ARK, ASK and VCEK): node state, shared by every pod.
func SimSPDir(cfg config.Config) string {
	return filepath.Join(cfg.Runtime.StateDir, "node", "sim-sp")
}

// simHost measures the files QEMU is handed and serves reports for them.
type simHost struct {
	spDir    string
	hostData [32]byte
	svc      *simtee.Service
}

func (s *simHost) prepare(argv []string) error {
	launch, err := simtee.LaunchFromArgv(argv)
	if err != nil {
		return err
	}
	m, err := simtee.Measure(launch)
	if err != nil {
		return fmt.Errorf("measure the sim launch: %w", err)
	}
	sp, err := simsp.Open(s.spDir)
	if err != nil {
		return err
	}
	s.svc = &simtee.Service{SP: sp, Measurement: m, HostData: s.hostData}
	return nil
}

func (s *simHost) attach(ctx context.Context, v *vm.VM) error {
	conn, err := v.DialPort(ctx, tee.SimAttestPort)
	if err != nil {
		return err
	}
	go func() {
		if err := simtee.Serve(ctx, conn, s.svc); err != nil {
			log.G(ctx).WithError(err).Warn("simulated secure processor stopped")
		}
	}()
	log.G(ctx).WithField("measurement", s.svc.Measurement.String()).Debug("sim launch measured")
	return nil
}
