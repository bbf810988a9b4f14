package agent

import (
	"context"
	"fmt"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/guest/spec"
)

// procDevices lists the guest kernel's drivers and their majors.
var procDevices = "/proc/devices"

// guestResources is what spec.Adapt checks a container's devices and
// cpuset against: the pod's measured device policy, the guest's drivers
// and its online CPUs and memory nodes.
type guestResources struct {
	devices      spec.DevicePolicy
	driverMajors map[string]int64
	cpus, mems   string
}

// guestResources reads them. Without the guest's driver list the guest's
// own devices with dynamic majors could not be told apart, so that failure
// fails the create; unknown online CPUs only skip the cpuset check.
func (s *Service) guestResources(ctx context.Context) (guestResources, error) {
	s.mu.Lock()
	p := s.policy
	s.mu.Unlock()
	g := guestResources{devices: spec.DevicePolicy{Restricted: p.DevicesRestricted(), Allow: p.DeviceRules()}}
	var err error
	if g.driverMajors, err = spec.DriverMajors(procDevices); err != nil {
		return g, fmt.Errorf("read the guest's device drivers: %w", err)
	}
	sys := s.cfg.SysDir
	if sys == "" {
		sys = "/sys"
	}
	if g.cpus, g.mems, err = spec.ReadOnline(sys); err != nil {
		log.G(ctx).WithError(err).Warn("cpusets are not checked against the guest's CPUs")
	}
	return g, nil
}
