package sim

import (
	"context"
	"net"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/measurements/snp"
)

// PortDialer connects to the host end of one of a VM's virtio-serial
// ports (launcher/vm's VM.DialPort).
type PortDialer interface {
	DialPort(ctx context.Context, name string) (net.Conn, error)
}

// Host is the host side of one sim VM: its launch measurement and the
// simulated secure processor that signs its reports. The shim's pod VMs
// and the VMs a node receives by migration both use it.
type Host struct {
	svc *Service
}

// NewHost measures the launch of the QEMU command line argv (what QEMU is
// about to be handed, before it starts) and opens the node's simulated
// secure processor in spDir (created on first use). hostData is the VM's
// HOST_DATA, the digest of its init data.
func NewHost(argv []string, spDir string, hostData [32]byte) (*Host, error) {
	launch, err := LaunchFromArgv(argv)
	if err != nil {
		return nil, err
	}
	m, err := measuredLaunch(launch) // memo.go
	if err != nil {
		return nil, err
	}
	sp, err := Open(spDir)
	if err != nil {
		return nil, err
	}
	svc := &Service{SP: sp, Measurement: m.m, HostData: hostData, EventLog: m.eventLog, RTMRs: m.rtmrs}
	return &Host{svc: svc}, nil
}

// Measurement is the VM's sim launch digest.
func (h *Host) Measurement() snp.Digest { return h.svc.Measurement }

// Attach connects to the VM's AttestPort once QEMU runs and serves the
// guest's GetReport requests there until ctx ends.
func (h *Host) Attach(ctx context.Context, vm PortDialer) error {
	conn, err := vm.DialPort(ctx, AttestPort)
	if err != nil {
		return err
	}
	go func() {
		if err := Serve(ctx, conn, h.svc); err != nil {
			log.G(ctx).WithError(err).Warn("simulated secure processor stopped")
		}
	}()
	log.G(ctx).WithField("measurement", h.svc.Measurement.String()).Debug("sim launch measured")
	return nil
}
