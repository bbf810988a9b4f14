package initdata

import (
	"fmt"
	"strings"
	"testing"
)

// policyDoc is init data with a broker secret and a [policy] section, as
// guest/api/policy's documentation shows it.
func policyDoc(t *testing.T, policy string) []byte {
	t.Helper()
	return fmt.Appendf(nil, `version = "0.1"
[kbs]
url = "https://127.0.0.1:8443"
cert = '''
%s'''
[[kbs.secrets]]
resource = "kbs:///default/key/db-password"
path = "/run/secrets/db-password"
%s`, selfSignedPEM(t), policy)
}

const examplePolicy = `
[policy]
audit = false
stats = true
update_resources = true

[policy.sandbox]
image = "registry.k8s.io/pause:3.10"
args = ["/pause"]
env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
working_dir = "/"
uid = 65535
gid = 65535

[policy.containers.app]
image = "ghcr.io/example/app@sha256:0f6e"
args = ["/app", "--listen=:8080"]
env = [
  "PATH=/usr/local/bin:/usr/bin:/bin",
  "re:HOSTNAME=app-[a-z0-9]+-[a-z0-9]{5}",
  "re:[A-Z0-9_]+_(SERVICE|PORT)[A-Z0-9_]*=[a-z0-9.:/]*",
]
working_dir = "/"
uid = 1000
gid = 1000
no_new_privileges = true
read_only_root = true
capabilities = ["CAP_NET_BIND_SERVICE"]
logs = true
exec = [["/app", "healthcheck"]]
secrets = [{ resource = "kbs:///default/key/db-password", path = "/etc/app/db-password" }]
mounts = [
  { destination = "/var/run/secrets/kubernetes.io/serviceaccount", kind = "shared", read_only = true },
  { destination = "/cache", kind = "tmpfs" },
]
`

func TestParsePolicy(t *testing.T) {
	d, err := Parse(policyDoc(t, examplePolicy))
	if err != nil {
		t.Fatal(err)
	}
	app := d.Policy.Containers["app"]
	if !d.PolicyGoverns() || app == nil || *app.UID != 1000 || len(app.Exec) != 1 || app.Mounts[0].Kind != "shared" || app.Secrets[0].Path != "/etc/app/db-password" || d.Policy.Sandbox.Args[0] != "/pause" {
		t.Fatalf("Parse = %+v", d.Policy)
	}
	// Without a [policy] section the agent keeps its earlier behaviour.
	if d, err := Parse([]byte("version = \"0.1\"\n")); err != nil || d.PolicyGoverns() {
		t.Fatalf("no [policy]: %+v, %v", d, err)
	}
	// CoCo's format carries it in c8s.toml.
	coco := "version = \"0.1.0\"\nalgorithm = \"sha384\"\n[data]\n\"c8s.toml\" = '''\n[policy]\n[policy.containers.app]\nimage = \"x\"\nargs = [\"y\"]\nworking_dir = \"/\"\nuid = 0\ngid = 0\n'''\n"
	if d, err := Parse([]byte(coco)); err != nil || d.Policy.Containers["app"] == nil {
		t.Fatalf("CoCo: %+v, %v", d, err)
	}
}

// Mistakes in the policy are errors naming the key.
func TestParsePolicyStrict(t *testing.T) {
	for policy, want := range map[string]string{
		"[policy]\nauditt = true\n": "unknown key policy.auditt (known in policy: audit, containers, network, sandbox, stats, update_resources)",
		"[policy.containers.app]\nimage = \"x\"\nargs = [\"y\"]\nmountz = []\n":                                             "unknown key policy.containers.app.mountz (known in policy.containers.app: additional_gids, args,",
		"[policy.containers.app]\nimage = \"x\"\nargs = [\"y\"]\nmounts = [{ destination = \"/x\", knd = \"tmpfs\" }]\n":    "unknown key policy.containers.app.mounts.knd (known in policy.containers.app.mounts: destination, kind, read_only, source, volume)",
		"[policy.containers.app]\nargs = [\"y\"]\n":                                                                         "policy.containers.app.image: required",
		"[policy.containers.app]\nimage = \"x\"\nargs = [\"y\"]\nsecrets = [{ resource = \"kbs:///default/key/other\" }]\n": "policy.containers.app.secrets[0].resource",
		"[agent_policy]\nallow_exec = true\n[policy]\n":                                                                     "agent_policy.allow_exec does not apply with a [policy] section",
	} {
		_, err := Parse(policyDoc(t, policy))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want one saying %q", policy, err, want)
		}
	}
}

// The key broker releases secrets only where the host cannot run code of
// its choosing: under an enforced [policy]. Without one, allow_exec =
// false does not stop the host from creating a container of its own.
func TestHostCanRunCode(t *testing.T) {
	for doc, want := range map[string]string{
		"version = \"0.1\"\n": "no [policy] section",
		"version = \"0.1\"\n[agent_policy]\nallow_exec = false\n":                                "whatever agent_policy.allow_exec says",
		"version = \"0.1\"\n[policy]\naudit = true\n":                                            "audit mode",
		string(policyDoc(t, strings.Replace(examplePolicy, "audit = false", "audit = true", 1))): "audit mode",
		string(policyDoc(t, examplePolicy)):                                                      "",
		"version = \"0.1\"\n[policy]\n":                                                          "", // nothing may be created
	} {
		d, err := Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		can, reason := d.HostCanRunCode()
		if can != (want != "") || want != "" && !strings.Contains(reason, want) {
			t.Errorf("%s: HostCanRunCode = %v, %q; want %v naming %q", doc, can, reason, want != "", want)
		}
	}
}
