package agent

import (
	"context"
	"fmt"
	"strconv"

	"github.com/containerd/errdefs"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/network"
)

// configureNetwork wires the pod's NICs into the network namespace of the
// sandbox container whose init process is pid (created, not started yet),
// which the pod's other containers join.
func (s *Service) configureNetwork(ctx context.Context, id string, req *agentapi.PodNetwork, pid int) error {
	if len(req.GetInterfaces()) == 0 {
		return nil
	}
	if pid <= 0 {
		return fmt.Errorf("container %q: no init process to configure the pod network for: %w", id, errdefs.ErrFailedPrecondition)
	}
	err := network.Configure(ctx, req, "/proc/"+strconv.Itoa(pid)+"/ns/net", network.Options{LoadDriver: s.cfg.LoadNetDriver})
	if err != nil {
		return fmt.Errorf("configure the pod network in container %q: %w", id, err)
	}
	return nil
}
