package task

import (
	"net"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/shim/podnet"
)

func TestNetnsPathIsThePodNamespace(t *testing.T) {
	cri := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"},
	}}}
	if got := netnsPath(cri); got != "/var/run/netns/cni-1" {
		t.Errorf("CNI pod: netns %q", got)
	}
	hostNet := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}}}}
	fresh := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace}}}}
	for name, s := range map[string]*specs.Spec{"host network": hostNet, "new namespace": fresh, "no linux": {}} {
		if got := netnsPath(s); got != "" {
			t.Errorf("%s: netns %q, want none", name, got)
		}
	}
}

func TestOnlyTheFirstContainerCarriesTheNetwork(t *testing.T) {
	pod := &podState{network: &podnet.Network{Endpoints: []podnet.Endpoint{{
		Name: "eth0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, MTU: 1500,
		Addresses: []*net.IPNet{{IP: net.IPv4(10, 0, 0, 2), Mask: net.CIDRMask(24, 32)}},
	}}}}
	req := podNetworkFor(true, pod)
	if len(req.GetInterfaces()) != 1 || req.Interfaces[0].Name != "eth0" || req.Interfaces[0].Addresses[0] != "10.0.0.2/24" {
		t.Fatalf("first container: %v", req)
	}
	if req := podNetworkFor(false, pod); req != nil {
		t.Fatalf("later container: %v, want none", req)
	}
	if req := podNetworkFor(true, &podState{}); req != nil {
		t.Fatalf("host-network pod: %v, want none", req)
	}
}
