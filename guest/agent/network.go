package agent

import (
	"context"
	"fmt"
	"strconv"

	"github.com/containerd/errdefs"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/network"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/guest/spec"
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

// checkNetwork decides, before anything of the create is carried out,
// whether the host may wire the pod network req with container c
// ([policy.network], guest/policy PodNetwork).
func (s *Service) checkNetwork(c *policy.Container, req *agentapi.PodNetwork) error {
	if req == nil {
		return nil
	}
	return s.evaluator().PodNetwork(c, podNetworkOf(req))
}

// podNetworkOf is the pod network request as the policy sees it.
func podNetworkOf(req *agentapi.PodNetwork) *policy.PodNetwork {
	n := &policy.PodNetwork{}
	for _, ni := range req.GetInterfaces() {
		n.Interfaces = append(n.Interfaces, policy.Interface{Name: ni.GetName(), MAC: ni.GetMac(), MTU: ni.GetMtu(), Addresses: ni.GetAddresses()})
	}
	for _, r := range req.GetRoutes() {
		n.Routes = append(n.Routes, policy.Route{Interface: r.GetInterface(), Destination: r.GetDestination(), Gateway: r.GetGateway(), Source: r.GetSource(), Scope: r.GetScope()})
	}
	return n
}

// fileContents are the contents of the host files a plan writes, by guest
// path, for the policy.
func fileContents(files []spec.GuestFile) map[string][]byte {
	out := make(map[string][]byte, len(files))
	for _, f := range files {
		out[f.Path] = f.Content
	}
	return out
}
