package e2e

import (
	"context"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// testPolicyPodMore plays the host's attacks on the process fields, the
// emptyDir volumes and the pod network against PolicyPod, whose app may
// mount its emptyDir "cache" on /cache and which runs under the default
// [policy.network]. Each changes one thing of app's spec, which the guest
// accepts (PodRuns).
func testPolicyPodMore(t *testing.T, c context.Context, p *hostPod) {
	t.Run("EmptyDirOfAnotherVolume", func(t *testing.T) {
		// The host hands app another container's emptyDir on /cache,
		// where the pod spec mounts app's own.
		s := containerSpec("app", true, appArgs...)
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/cache", Type: "bind",
			Source: "/var/lib/kubelet/pods/0f1e2d3c/volumes/kubernetes.io~empty-dir/reader-data", Options: []string{"rbind", "rw"}})
		p.createRefused(t, c, "attack-emptydir", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			`"/cache" (emptydir volume "reader-data")`, "policy.containers.app.mounts", "/cache (emptydir volume cache)")
	})

	t.Run("PermissiveUmask", func(t *testing.T) {
		s := containerSpec("app", true, appArgs...)
		umask := uint32(0)
		s.Process.User.Umask = &umask
		p.createRefused(t, c, "attack-umask", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			"process.user.umask 0", "policy.containers.app.umask", "022 or stricter")
	})

	t.Run("RaisedRlimit", func(t *testing.T) {
		s := containerSpec("app", true, appArgs...)
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_MEMLOCK", Soft: 1 << 40, Hard: 1 << 40})
		p.createRefused(t, c, "attack-rlimit", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			"RLIMIT_MEMLOCK soft 1099511627776", "policy.containers.app.rlimits", "RLIMIT_NOFILE ≤ 1048576")
	})

	t.Run("UserNamespaceMapsRoot", func(t *testing.T) {
		s := containerSpec("app", true, appArgs...)
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		s.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: 0, Size: 65536}}
		s.Linux.GIDMappings = s.Linux.UIDMappings
		p.createRefused(t, c, "attack-userns", "sandbox", s, "app", errdefs.ErrPermissionDenied,
			"linux.namespaces.user", "policy.containers.app.user_namespace")
	})

	// The pod network, sent with app's create: a second time, on a
	// container that is not the sandbox, and each with one attack.
	network := func(t *testing.T, id string, n *agent.PodNetwork, names ...string) {
		t.Helper()
		req := p.createRequest(t, id, "sandbox", containerSpec("app", true, appArgs...), "app")
		req.Network = n
		_, err := p.sb.Agent.CreateContainer(c, req)
		if err == nil {
			if _, rerr := p.sb.Agent.RemoveContainer(c, &agent.RemoveContainerRequest{ContainerId: id}); rerr != nil {
				t.Errorf("remove container %s: %v", id, errgrpc.ToNative(rerr))
			}
		}
		refused(t, err, errdefs.ErrPermissionDenied, append(names, "not the pod's sandbox")...)
	}
	eth0 := func() *agent.NetInterface {
		return &agent.NetInterface{Name: "eth0", Mac: "0a:58:0a:58:00:05", Mtu: 1500, Addresses: []string{"10.88.0.5/16"}}
	}
	t.Run("RouteTakesOverLoopback", func(t *testing.T) {
		network(t, "attack-route-lo", &agent.PodNetwork{Interfaces: []*agent.NetInterface{eth0()},
			Routes: []*agent.NetRoute{{Interface: "eth0", Destination: "127.0.0.0/8", Gateway: "10.88.0.1"}}},
			`network.routes[0].destination "127.0.0.0/8": in the loopback network`)
	})
	t.Run("SecondInterface", func(t *testing.T) {
		second := &agent.NetInterface{Name: "eth1", Mac: "0a:58:0a:59:00:05", Mtu: 1500, Addresses: []string{"10.89.0.5/16"}}
		network(t, "attack-second-nic", &agent.PodNetwork{Interfaces: []*agent.NetInterface{eth0(), second}},
			"network.interfaces 2 interfaces: too many by policy.network.max_interfaces (allowed: 1)")
	})
	t.Run("TinyMTU", func(t *testing.T) {
		nic := eth0()
		nic.Mtu = 68
		network(t, "attack-mtu", &agent.PodNetwork{Interfaces: []*agent.NetInterface{nic}},
			"network.interfaces[0].mtu 68", "policy.network.min_mtu")
	})
	t.Run("LoopbackAddress", func(t *testing.T) {
		nic := eth0()
		nic.Addresses = []string{"127.0.0.53/8"}
		network(t, "attack-lo-addr", &agent.PodNetwork{Interfaces: []*agent.NetInterface{nic}},
			`network.interfaces[0].addresses[0] "127.0.0.53/8"`)
	})
}
