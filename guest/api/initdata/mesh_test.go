package initdata

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// meshDoc is a document with a [mesh] section; extra is appended.
func meshDoc(t *testing.T, extra string) string {
	cert := selfSignedPEM(t)
	return fmt.Sprintf(`version = "0.1"
%s
[mesh]
url = "https://10.0.0.1:8443"
cert = '''
%s'''
ca = '''
%s'''
identity = "spiffe://c8s.test/ns/default/sa/server"
containers = ["app"]

[[mesh.inbound]]
port = 8080
allow = ["spiffe://c8s.test/ns/default/sa/client", "re:spiffe://c8s.test/ns/ops/sa/.*"]

[[mesh.outbound]]
port = 9000
peers = ["10.0.0.7", "10.1.0.0/16", "fd00::/64"]
identity = "spiffe://c8s.test/ns/default/sa/db"
`, extra, cert, cert)
}

func TestParseMesh(t *testing.T) {
	d, err := Parse([]byte(meshDoc(t, "")))
	if err != nil {
		t.Fatal(err)
	}
	m := d.Mesh
	if !m.Enabled() || m.Identity != "spiffe://c8s.test/ns/default/sa/server" || len(m.Inbound) != 1 || len(m.Outbound) != 1 {
		t.Fatalf("parsed %+v", m)
	}
	if addr, err := m.Address(); err != nil || addr != "10.0.0.1:8443" {
		t.Fatalf("Address = %q, %v", addr, err)
	}
	if !m.MountedInto("app") || m.MountedInto("sandbox") || m.MountedInto("other") {
		t.Fatal("MountedInto: want app only")
	}
	if !m.Inbound[0].Allow[1].Match("spiffe://c8s.test/ns/ops/sa/x") || m.Inbound[0].Allow[1].Match("spiffe://c8s.test/ns/dev/sa/x") {
		t.Fatal("allow patterns do not match as patterns")
	}
	if got := m.Ports(); len(got) != 2 || got[0] != 8080 || got[1] != 9000 {
		t.Fatalf("Ports = %v", got)
	}
	o := m.Outbound[0]
	for dst, want := range map[string]bool{
		"10.0.0.7:9000": true, "10.1.200.3:9000": true, "[fd00::5]:9000": true,
		"10.0.0.8:9000": false, "10.0.0.7:9001": false, "[fd01::5]:9000": false,
	} {
		if got := o.Covers(netip.MustParseAddrPort(dst)); got != want {
			t.Errorf("Covers(%s) = %v, want %v", dst, got, want)
		}
	}
	if !(MeshOutbound{Port: 9000}).Covers(netip.MustParseAddrPort("192.0.2.1:9000")) {
		t.Error("an entry without peers covers every address")
	}
	if m.RefusesUnmeshed() {
		t.Fatal("unmeshed traffic is refused by default")
	}
	if d, err := Parse([]byte(strings.Replace(meshDoc(t, ""), `containers = ["app"]`, "containers = [\"app\"]\nunmeshed = \"refuse\"", 1))); err != nil || !d.Mesh.RefusesUnmeshed() {
		t.Fatalf("unmeshed = refuse: %v", err)
	}
	var none *Mesh
	if none.Enabled() || none.MountedInto("app") || none.RefusesUnmeshed() {
		t.Fatal("no [mesh]: not enabled")
	}
}

func TestParseMeshRefused(t *testing.T) {
	good := meshDoc(t, "")
	for name, tc := range map[string]struct{ from, to, want string }{
		"http CA":          {`url = "https://10.0.0.1:8443"`, `url = "http://10.0.0.1:8443"`, "mesh.url"},
		"no url":           {`url = "https://10.0.0.1:8443"`, ``, "mesh.url is required"},
		"bad identity":     {`identity = "spiffe://c8s.test/ns/default/sa/server"`, `identity = "spiffe://c8s.test/default/server"`, "mesh.identity"},
		"upper identity":   {`identity = "spiffe://c8s.test/ns/default/sa/server"`, `identity = "spiffe://c8s.test/ns/Default/sa/server"`, "mesh.identity"},
		"no cert":          {"cert = '''", "cerx = '''", "mesh.cerx"},
		"port zero":        {"port = 8080", "port = 0", "mesh.inbound[0].port"},
		"inbound twice":    {"[[mesh.outbound]]", "[[mesh.inbound]]\nport = 8080\nallow = [\"spiffe://c8s.test/ns/default/sa/x\"]\n[[mesh.outbound]]", "is mesh.inbound[0].port too"},
		"outbound twice":   {`peers = ["10.0.0.7", "10.1.0.0/16", "fd00::/64"]` + "\n", "[[mesh.outbound]]\nport = 9000\npeers = [\"10.2.0.0/16\"]\nidentity = \"spiffe://c8s.test/ns/default/sa/db\"\n[[mesh.outbound]]\nport = 9000\n", "on every address"},
		"nobody allowed":   {`allow = ["spiffe://c8s.test/ns/default/sa/client", "re:spiffe://c8s.test/ns/ops/sa/.*"]`, `allow = []`, "allows no peer"},
		"bad allow regex":  {`"re:spiffe://c8s.test/ns/ops/sa/.*"`, `"re:("`, "mesh.inbound[0].allow"},
		"peer name":        {`"10.0.0.7"`, `"db.default"`, "not an IP address or CIDR"},
		"peer mapped":      {`"10.1.0.0/16"`, `"::ffff:10.1.0.0/112"`, "IPv4 form"},
		"port too big":     {"port = 9000", "port = 65536", "mesh.outbound[0].port"},
		"no peer identity": {`identity = "spiffe://c8s.test/ns/default/sa/db"`, `identity = ""`, "names no identity"},
		"sandbox mounted":  {`containers = ["app"]`, `containers = ["sandbox"]`, "mesh.containers[0]"},
		"unmeshed unknown": {`containers = ["app"]`, "containers = [\"app\"]\nunmeshed = \"drop\"", "mesh.unmeshed"},
	} {
		t.Run(name, func(t *testing.T) {
			doc := strings.Replace(good, tc.from, tc.to, 1)
			if doc == good {
				t.Fatalf("%q is not in the document", tc.from)
			}
			if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
	// A meshed port the host may port-forward to would bypass the mesh.
	for _, p := range []string{"8080", "9000"} {
		doc := meshDoc(t, "[agent_policy]\nallow_port_forward = ["+p+"]\n")
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "allow_port_forward") {
			t.Fatalf("port-forward to meshed port %s: err = %v", p, err)
		}
	}
	if _, err := Parse([]byte(meshDoc(t, "[agent_policy]\nallow_port_forward = [8081]\n"))); err != nil {
		t.Fatalf("port-forward to another port: %v", err)
	}
}

// A pod may serve a meshed port and call peers on the same port, and mesh
// one port towards several peer networks, each with its identity.
func TestParseMeshSharedPorts(t *testing.T) {
	doc := meshDoc(t, "") + `
[[mesh.outbound]]
port = 8080
peers = ["10.2.0.0/16"]
identity = "spiffe://c8s.test/ns/default/sa/a"

[[mesh.outbound]]
port = 8080
peers = ["10.3.0.0/16"]
identity = "spiffe://c8s.test/ns/default/sa/b"
`
	d, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Mesh.Outbound) != 3 || !d.Mesh.Outbound[2].Covers(netip.MustParseAddrPort("10.3.0.1:8080")) || d.Mesh.Outbound[1].Covers(netip.MustParseAddrPort("10.3.0.1:8080")) {
		t.Fatalf("outbound %+v", d.Mesh.Outbound)
	}
}
