package task

import (
	"context"
	"time"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/shim/podnet"
)

// netnsPath is the network namespace CRI made for the pod (CNI put its
// interfaces there), or "" for a host-network pod or a container without
// a pod.
func netnsPath(spec *specs.Spec) string {
	if spec.Linux == nil {
		return ""
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

// setupNetwork wires the pod's network namespace, if it has one, for the
// VM about to start. A nil Network (host network) is valid.
func setupNetwork(ctx context.Context, pod *podState) (*podnet.Network, error) {
	if pod.netns == "" {
		return nil, nil
	}
	t0 := time.Now()
	n, err := podnet.Setup(pod.netns)
	if err != nil {
		return nil, err
	}
	fields := log.Fields{"sandbox": pod.id, "netns": pod.netns, "took": time.Since(t0).Round(time.Millisecond)}
	for _, ep := range n.Endpoints {
		fields[ep.Name] = ep.Tap
	}
	log.G(ctx).WithFields(fields).Info("pod network namespace wired to the VM")
	return n, nil
}

// networkRequest is what the first container of the pod hands the agent.
func networkRequest(n *podnet.Network) *agent.PodNetwork {
	if n == nil || len(n.Endpoints) == 0 {
		return nil
	}
	return n.Request()
}

// closeNetwork removes the taps and redirects of the pod's namespace.
func closeNetwork(ctx context.Context, n *podnet.Network) {
	if n == nil {
		return
	}
	if err := n.Close(); err != nil {
		log.G(ctx).WithError(err).Warn("remove the pod network's taps")
	}
}

// podNetworkFor is the network request of a container: the pod's, for the
// container that started the VM (the sandbox container under CRI).
func podNetworkFor(started bool, pod *podState) *agent.PodNetwork {
	if !started {
		return nil
	}
	return networkRequest(pod.network)
}

// wireVM sets up what the pod's VM is wired to before it starts: the taps
// in its network namespace and its virtio-fs share (pod.network,
// pod.share). unwireVM undoes it.
func wireVM(ctx context.Context, pod *podState) ([]vm.NetDevice, *vm.SharedFS, error) {
	nw, err := setupNetwork(ctx, pod)
	if err != nil {
		return nil, nil, err
	}
	share, fs, err := startShare(ctx, pod)
	if err != nil {
		closeNetwork(ctx, nw)
		return nil, nil, err
	}
	pod.network, pod.share = nw, share
	var nics []vm.NetDevice
	if nw != nil {
		nics = nw.NICs()
	}
	return nics, fs, nil
}

// unwireVM removes the pod's taps and its virtio-fs share.
func unwireVM(ctx context.Context, pod *podState) {
	closeNetwork(ctx, pod.network)
	closeShare(ctx, pod)
	pod.network, pod.share = nil, nil
}
