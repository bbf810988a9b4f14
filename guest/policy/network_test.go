package policy

import (
	"fmt"
	"github.com/containerd/errdefs"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/pelletier/go-toml/v2"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// bridgeNetwork is what the shim sends for a CNI bridge pod.
func bridgeNetwork() *PodNetwork {
	return &PodNetwork{
		Interfaces: []Interface{{Name: "eth0", MAC: "0a:58:0a:58:00:05", MTU: 1500, Addresses: []string{"10.88.0.5/16", "fd00:88::5/64"}}},
		Routes: []Route{
			{Interface: "eth0", Destination: "10.88.0.0/16"},
			{Interface: "eth0", Destination: "0.0.0.0/0", Gateway: "10.88.0.1"},
			{Interface: "eth0", Destination: "::/0", Gateway: "fd00:88::1"},
		},
	}
}

// The pod network under the default [policy.network]: a bridge pod is
// wired, each attack is refused by name.
func TestMaliciousHostPodNetwork(t *testing.T) {
	e := evaluator(t, podPolicy)
	sb := sandbox(t, e)
	if err := e.PodNetwork(sb, bridgeNetwork()); err != nil {
		t.Fatalf("a CNI bridge pod: %v", err)
	}
	for field, change := range map[string]func(n *PodNetwork){
		"network.interfaces": func(n *PodNetwork) {
			n.Interfaces = append(n.Interfaces, Interface{Name: "eth1", MAC: "0a:58:0a:58:00:06", MTU: 1500})
		},
		"network.interfaces[0].mtu":          func(n *PodNetwork) { n.Interfaces[0].MTU = 68 },
		"network.interfaces[0].name":         func(n *PodNetwork) { n.Interfaces[0].Name = "lo" },
		"network.interfaces[0].addresses[1]": func(n *PodNetwork) { n.Interfaces[0].Addresses[1] = "127.0.0.2/8" },
		"network.routes[1].destination":      func(n *PodNetwork) { n.Routes[1].Destination = "127.0.0.0/8" },
		"network.routes[2].destination":      func(n *PodNetwork) { n.Routes[2].Destination = "::1/128" },
		"network.routes[0].interface":        func(n *PodNetwork) { n.Routes[0].Interface = "lo" },
		"network.routes[1].gateway":          func(n *PodNetwork) { n.Routes[1].Gateway = "127.0.0.1" },
	} {
		n := bridgeNetwork()
		change(n)
		d := denied(t, e.PodNetwork(sb, n), field, "")
		if !strings.Contains(d.Error(), "CreateContainer") {
			t.Errorf("%s: %v", field, d)
		}
	}
	// What the kernel would take otherwise than the checks judged, or a
	// route that breaks the pod's connections.
	for _, tc := range []struct {
		field  string
		change func(n *PodNetwork)
	}{
		{"network.routes[1].source", func(n *PodNetwork) { n.Routes[1].Source = "127.0.0.1" }},
		{"network.routes[1].source", func(n *PodNetwork) { n.Routes[1].Source = "::ffff:10.88.0.5" }},
		{"network.routes[2].source", func(n *PodNetwork) { n.Routes[2].Source = "10.88.0.5" }},
		{"network.routes[2].destination", func(n *PodNetwork) { n.Routes[2].Destination = "::ffff:127.0.0.0/104" }},
		{"network.routes[2].gateway", func(n *PodNetwork) { n.Routes[2].Gateway = "::ffff:10.88.0.1" }},
		{"network.routes[1].scope", func(n *PodNetwork) { n.Routes[1].Scope = 254 }},
		{"network.interfaces[0].addresses[1]", func(n *PodNetwork) { n.Interfaces[0].Addresses[1] = "::ffff:10.96.0.10/104" }},
		{"network.routes", func(n *PodNetwork) {
			for range maxRoutes {
				n.Routes = append(n.Routes, n.Routes[0])
			}
		}},
		{"network.interfaces[0].addresses", func(n *PodNetwork) {
			for i := range maxAddresses {
				n.Interfaces[0].Addresses = append(n.Interfaces[0].Addresses, fmt.Sprintf("10.88.1.%d/16", i))
			}
		}},
		{"network.interfaces[0].name", func(n *PodNetwork) { n.Interfaces[0].Name = "lo\x00" }},
		{"network.interfaces[0].name", func(n *PodNetwork) { n.Interfaces[0].Name = "eth0-with-a-long-name" }},
		{"network.interfaces[0].mac", func(n *PodNetwork) { n.Interfaces[0].MAC = "not-a-mac" }},
		{"network.interfaces[1].mac", func(n *PodNetwork) {
			n.Interfaces = append(n.Interfaces, Interface{Name: "eth1", MAC: "0A-58-0A-58-00-05", MTU: 1500})
		}},
	} {
		n := bridgeNetwork()
		tc.change(n)
		denied(t, e.PodNetwork(sb, n), tc.field, "")
	}
	// A route from the interface's own address, link scope: as a CNI bridge
	// sets its subnet's route.
	n := bridgeNetwork()
	n.Routes[0].Source, n.Routes[0].Scope = "10.88.0.5", scopeLink
	if err := e.PodNetwork(sb, n); err != nil {
		t.Errorf("a link route from the pod's address: %v", err)
	}
	// Only with the pod's sandbox.
	app, err := create(t, e, appSpec())
	if err != nil {
		t.Fatal(err)
	}
	denied(t, e.PodNetwork(app, bridgeNetwork()), "network", "")
	// No policy: the host's network.
	if err := New(nil, nil).PodNetwork(nil, &PodNetwork{Interfaces: []Interface{{Name: "lo"}}}); err != nil {
		t.Errorf("without a policy: %v", err)
	}
}

// A [policy.network] section narrows addresses, routes and DNS.
func TestPodNetworkSection(t *testing.T) {
	e := evaluator(t, `
[policy.network]
max_interfaces = 2
min_mtu = 9000
addresses = ["10.88.0.0/16"]
routes = ["0.0.0.0/0", "10.0.0.0/8"]
dns = ["10.96.0.10"]
dns_search = ["default.svc.cluster.local"]
`+podPolicy[strings.Index(podPolicy, "[policy.sandbox]"):])
	sb := sandbox(t, e)
	n := bridgeNetwork()
	n.Interfaces[0].MTU = 9000
	err := e.PodNetwork(sb, n)
	denied(t, err, "network.interfaces[0].addresses[1]", "policy.network.addresses")
	denied(t, err, "network.routes[2].destination", "policy.network.routes")
	n.Interfaces[0].MTU = 1500
	denied(t, e.PodNetwork(sb, n), "network.interfaces[0].mtu", "policy.network.min_mtu")

	resolv := func(ns string) (*specs.Spec, map[string][]byte) {
		s := appSpec()
		src := "/run/c8s/containers/abc/files/1-resolv.conf"
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: src, Options: []string{"rbind", "ro"}})
		return s, map[string][]byte{src: []byte("search default.svc.cluster.local\nnameserver " + ns + "\noptions ndots:5\n")}
	}
	s, files := resolv("10.96.0.10")
	if _, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sb, Files: files}); err != nil {
		t.Fatalf("the cluster's DNS: %v", err)
	}
	s, files = resolv("203.0.113.53")
	_, err = e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sb, Files: files})
	denied(t, err, "mounts[8] /etc/resolv.conf nameserver", "policy.network.dns")
	// Behind a line longer than a line reader takes, which the resolver
	// reads past.
	s, files = resolv("10.96.0.10")
	for src := range files {
		files[src] = append([]byte("# "+strings.Repeat("x", 70000)+"\nnameserver 203.0.113.53\n"), files[src]...)
	}
	_, err = e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sb, Files: files})
	denied(t, err, "mounts[8] /etc/resolv.conf nameserver", "policy.network.dns")
}

// kubeletHosts is the /etc/hosts the kubelet writes for pod web-0 of
// StatefulSet web (its subdomain) at 10.88.0.5, with a hostAlias.
const kubeletHosts = `# Kubernetes-managed hosts file.
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
fe00::0	ip6-localnet
fe00::0	ip6-mcastprefix
fe00::1	ip6-allnodes
fe00::2	ip6-allrouters
10.88.0.5	web-0.web.default.svc.cluster.local	web-0

# Entries added by HostAliases.
10.1.2.3	db.internal
`

// TestMaliciousHostBypassesPinnedDNS: the owner pins the nameservers
// (dns), and the host answers the pod's lookups anyway: through /etc/hosts,
// which the resolver reads first, or a search domain it controls, tried
// first for every short name. With dns set, both are pinned too.
func TestMaliciousHostBypassesPinnedDNS(t *testing.T) {
	e := evaluator(t, `
[policy.network]
dns = ["10.96.0.10"]
dns_search = ["default.svc.cluster.local", "svc.cluster.local", "cluster.local"]
hosts = ["10.1.2.3 db.internal"]
hostname = "re:web-[0-9]+"
`+podPolicy[strings.Index(podPolicy, "[policy.sandbox]"):])
	sb := sandbox(t, e)
	if err := e.PodNetwork(sb, bridgeNetwork()); err != nil {
		t.Fatal(err)
	}
	const resolv = "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
	create := func(hosts, resolvConf string) error { return createWithDNSFiles(e, sb, hosts, resolvConf) }
	// The pod's own line needs the sandbox wired: admitted is not enough
	// (the guest may fail to configure what the policy admitted).
	if err := create(kubeletHosts, resolv); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "10.88.0.5 web-0") {
		t.Fatalf("the pod's line before the sandbox was wired: %v", err)
	}
	e.PodWired(sb, "web-0", bridgeNetwork())
	if err := create(kubeletHosts, resolv); err != nil {
		t.Fatalf("the kubelet's files: %v", err)
	}
	for _, tc := range []struct{ hosts, resolv, field string }{
		{kubeletHosts + "203.0.113.66 api.example.com\n", resolv, "/etc/hosts"},
		{kubeletHosts + "127.0.0.1 api.example.com\n", resolv, "/etc/hosts"},
		{kubeletHosts + "203.0.113.66 web-0\n", resolv, "/etc/hosts"},
		{kubeletHosts + "10.1.2.3 db.internal api.example.com\n", resolv, "/etc/hosts"},
		{kubeletHosts, "search evil.example\n" + resolv, "/etc/resolv.conf search"},
		{kubeletHosts, "domain evil.example\n" + resolv, "/etc/resolv.conf domain"},
	} {
		err := create(tc.hosts, tc.resolv)
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("hosts %q, resolv.conf %q: %v, want a denial of %s", tc.hosts[len(kubeletHosts):], tc.resolv, err, tc.field)
		}
	}
	// A sandbox whose create failed gives back what it was wired with; the
	// next one's hostname and addresses replace it, not add to it.
	e.ReleaseSandbox(sb)
	if err := create(kubeletHosts, resolv); err == nil || !strings.Contains(err.Error(), "/etc/hosts") {
		t.Fatalf("the pod's line after its sandbox was released: %v", err)
	}
	sb = sandbox(t, e)
	spoof := bridgeNetwork()
	spoof.Interfaces[0].Addresses = []string{"203.0.113.66/32"}
	e.PodWired(sb, "api", spoof)
	e.PodWired(sb, "web-0", bridgeNetwork())
	for _, line := range []string{"203.0.113.66 api.bank.example", "203.0.113.66 api", "203.0.113.66 web-0"} {
		if err := create(kubeletHosts+line+"\n", resolv); err == nil || !strings.Contains(err.Error(), line) {
			t.Errorf("%q after the sandbox was wired again: %v", line, err)
		}
	}
	// Without dns the host's resolution is taken as it is.
	e = evaluator(t, podPolicy)
	sb = sandbox(t, e)
	if err := create(kubeletHosts+"203.0.113.66 api.example.com\n", "search evil.example\n"+resolv); err != nil {
		t.Errorf("without dns: %v", err)
	}
}

func TestNetworkSectionValidated(t *testing.T) {
	for _, bad := range []string{"max_interfaces = 100", "min_mtu = 10", `addresses = ["10.0.0.0/33"]`, `routes = ["default"]`, `dns = ["re:("]`,
		`dns_search = ["cluster.local"]`, "dns = [\"10.96.0.10\"]\nhosts = [\"re:(\"]"} {
		p := parsePolicy(t, "[policy.network]\n"+bad+"\n")
		if err := p.Validate(nil); err == nil || !strings.Contains(err.Error(), "policy.network.") {
			t.Errorf("%s: Validate = %v", bad, err)
		}
	}
}

// parsePolicy reads a [policy] section without validating it.
func parsePolicy(t *testing.T, doc string) *policyapi.Policy {
	t.Helper()
	var d struct {
		Policy *policyapi.Policy `toml:"policy"`
	}
	if err := toml.Unmarshal([]byte(doc), &d); err != nil {
		t.Fatal(err)
	}
	return d.Policy
}
