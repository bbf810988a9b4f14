package policy

import (
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// createWithDNSFiles creates an app container of sandbox sb's pod with
// this /etc/hosts and /etc/resolv.conf (host files, passed by value).
func createWithDNSFiles(e *Evaluator, sb *Container, hosts, resolv string) error {
	s := appSpec() // no hostname: containerd's app containers join the sandbox's UTS namespace
	files := map[string][]byte{}
	for dst, body := range map[string]string{"/etc/hosts": hosts, "/etc/resolv.conf": resolv} {
		src := "/run/c8s/containers/abc/files/" + strings.TrimPrefix(dst, "/etc/")
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "ro"}})
		files[src] = []byte(body)
	}
	_, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sb, Files: files})
	return err
}

// hostsCreate returns a create of an app container of the pod with this
// /etc/hosts and a resolv.conf the pinned dns allows, against a sandbox
// wired with hostname at bridgeNetwork's addresses.
func hostsCreate(t *testing.T, e *Evaluator, hostname string) func(hosts string) error {
	t.Helper()
	sb := sandbox(t, e)
	if err := e.PodNetwork(sb, bridgeNetwork()); err != nil {
		t.Fatal(err)
	}
	e.PodWired(sb, hostname, bridgeNetwork())
	const resolv = "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\n"
	return func(hosts string) error { return createWithDNSFiles(e, sb, hosts, resolv) }
}

// TestMaliciousHostNamesPodAfterOthers: with name resolution pinned, the
// host chooses the pod's hostname, and /etc/hosts may name the pod by it
// on its own address. A hostname such as "api.bank.example", or a
// subdomain outside the pinned search domains, would answer a name the
// pod looks up elsewhere with the pod itself. Only a single DNS label is
// taken as the hostname, and with [policy.network] hostname only what it
// allows (a short name such as a service's "db" too).
func TestMaliciousHostNamesPodAfterOthers(t *testing.T) {
	const pinned = `
[policy.network]
dns = ["10.96.0.10"]
dns_search = ["default.svc.cluster.local", "svc.cluster.local", "cluster.local"]
`
	sections := podPolicy[strings.Index(podPolicy, "[policy.sandbox]"):]
	for _, tc := range []struct {
		name, extra, hostname, line string
		ok                          bool
	}{
		{"kubelet's short name", "", "web-0", "10.88.0.5 web-0", true},
		{"an FQDN, hostname not pinned", "", "db-0", "10.88.0.5 db-0.db.default.svc.cluster.local", false},
		{"a Service's FQDN", "", "kubernetes", "10.88.0.5 kubernetes.default.svc.cluster.local", false},
		{"a Service of another namespace", `hostname = "re:web-[0-9]+"` + "\n", "web-0", "10.88.0.5 web-0.prod.svc.cluster.local", false},
		{"a dotted hostname", "", "api.bank.example", "10.88.0.5 api.bank.example", false},
		{"its first label", "", "api.bank.example", "10.88.0.5 api", false},
		{"a subdomain outside the search domains", `hostname = "re:web-[0-9]+"` + "\n", "web-0", "10.88.0.5 web-0.evil.example", false},
		{"a deeper name", `hostname = "re:web-[0-9]+"` + "\n", "web-0", "10.88.0.5 web-0.a.b.default.svc.cluster.local", false},
		{"not a label", "", "web_0", "10.88.0.5 web_0", false},
		{"pinned", `hostname = "re:web-[0-9]+"` + "\n", "web-0", "10.88.0.5 web-0.web.default.svc.cluster.local web-0", true},
		{"a service's short name", `hostname = "re:web-[0-9]+"` + "\n", "db", "10.88.0.5 db", false},
		{"setHostnameAsFQDN", `hostname = "re:web-[0-9]+\\.web\\.default\\.svc\\.cluster\\.local"` + "\n", "web-0.web.default.svc.cluster.local",
			"10.88.0.5 web-0.web.default.svc.cluster.local web-0", true},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "-"), func(t *testing.T) {
			create := hostsCreate(t, evaluator(t, pinned+tc.extra+sections), tc.hostname)
			err := create("127.0.0.1 localhost\n" + tc.line + "\n")
			if tc.ok && err != nil {
				t.Errorf("hostname %q, %q: %v", tc.hostname, tc.line, err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), "policy.network.hosts")) {
				t.Errorf("hostname %q, %q: %v, want a denial naming policy.network.hosts", tc.hostname, tc.line, err)
			}
		})
	}
}
