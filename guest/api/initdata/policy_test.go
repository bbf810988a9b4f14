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

// pinnedLayer is a [[layers]] entry: the rule's root is the owner's image.
const pinnedLayer = "{ digest = \"sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef\", verity = \"9c3a0f6e4bd1c2a3e4f5061728394a5b6c7d8e9f00112233445566778899aabb\", blocks = 1187 }"

// pinned adds the pinned layer to every rule of examplePolicy.
func pinned(policy string) string {
	return strings.NewReplacer("uid = 65535\n", "uid = 65535\nlayers = ["+pinnedLayer+"]\n", "uid = 1000\n", "uid = 1000\nlayers = ["+pinnedLayer+"]\n").Replace(policy)
}

// The key broker releases secrets only where the host cannot run code of
// its choosing: under an enforced [policy] whose rules bind every
// container to the owner's image. Without a [policy], allow_exec = false
// does not stop the host from creating a container of its own; a rule
// without layers runs the host's root file system.
func TestHostCanRunCode(t *testing.T) {
	for doc, want := range map[string]string{
		"version = \"0.1\"\n": "no [policy] section",
		"version = \"0.1\"\n[agent_policy]\nallow_exec = false\n":                                                   "whatever agent_policy.allow_exec says",
		"version = \"0.1\"\n[policy]\naudit = true\n":                                                               "audit mode",
		string(policyDoc(t, strings.Replace(examplePolicy, "audit = false", "audit = true", 1))):                    "audit mode",
		string(policyDoc(t, examplePolicy)):                                                                         `rules "sandbox", "app" do not pin their images' layers ([[policy.sandbox.layers]], [[policy.containers.app.layers]]), so the host supplies their root file systems and can run its own binaries under the rules' argv: pin the layers with c8s-measure policy --image`,
		string(policyDoc(t, strings.Replace(pinned(examplePolicy), "uid = 1000\nlayers", "uid = 1000\nlayerz", 1))): "",
		string(policyDoc(t, pinned(examplePolicy))):                                                                 "",
		"version = \"0.1\"\n[policy]\n":                                                                             "", // nothing may be created
	} {
		if strings.Contains(doc, "layerz") {
			// The app's rule alone without layers: named alone.
			doc = strings.Replace(doc, "layerz = ["+pinnedLayer+"]\n", "", 1)
			want = `rule "app" does not pin its image's layers ([[policy.containers.app.layers]]), so the host supplies its root file system and can run its own binaries under the rule's argv`
		}
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

// An owner may accept the host's root file systems (a relying party's
// opt-out): that lifts the rules without layers, and nothing else.
func TestHostCanRunCodeAcceptHostRootfs(t *testing.T) {
	accept := HostCodeOptions{AcceptHostRootfs: true}
	d, err := Parse(policyDoc(t, examplePolicy))
	if err != nil {
		t.Fatal(err)
	}
	if keys := d.HostRootfsRules(); strings.Join(keys, ",") != "policy.sandbox,policy.containers.app" {
		t.Fatalf("HostRootfsRules = %q", keys)
	}
	if can, reason := d.HostCanRunCodeWith(accept); can {
		t.Fatalf("host root file systems accepted: HostCanRunCodeWith = true, %q", reason)
	}
	for doc, want := range map[string]string{
		"version = \"0.1\"\n":                         "no [policy] section",
		"version = \"0.1\"\n[policy]\naudit = true\n": "audit mode",
		string(policyDoc(t, strings.Replace(examplePolicy, `exec = [["/app", "healthcheck"]]`, `exec = [["sh", "-c", "re:.*"]]`, 1))): `policy.containers.app.exec[0] ["sh", "-c", "re:.*"]: the script of sh -c is the pattern`,
	} {
		d, err := Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if can, reason := d.HostCanRunCodeWith(accept); !can || !strings.Contains(reason, want) {
			t.Errorf("%s: HostCanRunCodeWith(accept host rootfs) = %v, %q; want true naming %q", doc, can, reason, want)
		}
		if keys := d.HostRootfsRules(); d.Policy == nil || d.Policy.Audit {
			if keys != nil {
				t.Errorf("%s: HostRootfsRules = %q without an enforced [policy]", doc, keys)
			}
		}
	}
}

// Rules that bind the image but still run the host's code: each shape is
// named by its key, and the same rule with the shape removed passes.
func TestHostCanRunCodeRuleShapes(t *testing.T) {
	base := pinned(examplePolicy)
	app := `logs = true
`
	for name, tc := range map[string]struct{ from, to, want string }{
		"shell script pattern in an exec": {`exec = [["/app", "healthcheck"]]`, `exec = [["/bin/sh", "-c", "re:echo .*"]]`, `policy.containers.app.exec[0] ["/bin/sh", "-c", "re:echo .*"]: the script of /bin/sh -c is the pattern "re:echo .*"`},
		"any program and script":          {`exec = [["/app", "healthcheck"]]`, `exec = [["re:.*", "re:.*", "re:.*"]]`, `policy.containers.app.exec[0]`},
		"interpreter script in the args":  {`args = ["/app", "--listen=:8080"]`, `args = ["python3", "-c", "re:.+"]`, `policy.containers.app.args ["python3", "-c", "re:.+"]: the script of python3 -c`},
		"a shell with the host's stdin":   {`exec = [["/app", "healthcheck"]]`, "exec = [[\"sh\"]]\nexec_stdin = true", `policy.containers.app.exec[0] ["sh"] with exec_stdin = true`},
		"the program reading stdin":       {`args = ["/app", "--listen=:8080"]`, "args = [\"/bin/bash\", \"-s\"]\nstdin = true", `policy.containers.app.args ["/bin/bash", "-s"] with stdin = true`},
		"LD_PRELOAD of the host's":        {`"PATH=/usr/local/bin:/usr/bin:/bin",`, `"PATH=/usr/local/bin:/usr/bin:/bin", "re:LD_PRELOAD=.*",`, `policy.containers.app.env[1] "re:LD_PRELOAD=.*" admits LD_PRELOAD=`},
		"any variable":                    {`"PATH=/usr/local/bin:/usr/bin:/bin",`, `"PATH=/usr/local/bin:/usr/bin:/bin", "re:[A-Z_]+=.*",`, `admits LD_PRELOAD=`},
		"BASH_ENV of the host's":          {`"PATH=/usr/local/bin:/usr/bin:/bin",`, `"PATH=/usr/local/bin:/usr/bin:/bin", "re:BASH_ENV=/etc/.*",`, `admits BASH_ENV=`},
		"a share over the program":        {`{ destination = "/cache", kind = "tmpfs" },`, `{ destination = "/cache", kind = "tmpfs" }, { destination = "/", kind = "shared" },`, `policy.containers.app.mounts[2] (kind shared, destination "/") puts the host's files over /bin`},
		"a share over the program's dir":  {`args = ["/app", "--listen=:8080"]`, "args = [\"/opt/app/bin/app\"]", ``},
		"a share over a PATH directory":   {`{ destination = "/cache", kind = "tmpfs" },`, `{ destination = "/cache", kind = "tmpfs" }, { destination = "/usr/local/bin", kind = "shared", read_only = true },`, `destination "/usr/local/bin") puts the host's files over /usr/local/bin`},
		"a share pattern over the libs":   {`{ destination = "/cache", kind = "tmpfs" },`, `{ destination = "/cache", kind = "tmpfs" }, { destination = "re:/usr/.*", kind = "shared" },`, `destination "re:/usr/.*") puts the host's files over /usr/bin`},
	} {
		t.Run(name, func(t *testing.T) {
			policy := strings.Replace(base, tc.from, tc.to, 1)
			if policy == base {
				t.Fatalf("%q is not in the policy", tc.from)
			}
			if name == "a share over the program's dir" {
				policy = strings.Replace(policy, app, app+"stdin = false\n", 1)
				policy = strings.Replace(policy, `{ destination = "/cache", kind = "tmpfs" },`, `{ destination = "/cache", kind = "tmpfs" }, { destination = "/opt/app", kind = "shared", read_only = true },`, 1)
				tc.want = `policy.containers.app.mounts[2] (kind shared, destination "/opt/app") puts the host's files over /opt/app/bin/app`
			}
			d, err := Parse(policyDoc(t, policy))
			if err != nil {
				t.Fatal(err)
			}
			can, reason := d.HostCanRunCode()
			if !can || !strings.Contains(reason, tc.want) {
				t.Fatalf("HostCanRunCode = %v, %q; want true naming %q", can, reason, tc.want)
			}
			if strings.Contains(reason, "layers") {
				t.Errorf("the layers are pinned, yet the reason names them: %q", reason)
			}
		})
	}
	// What stays the owner's: data from a share, exact scripts, patterns
	// for values that load no code, the program picked among the image's.
	for name, policy := range map[string]string{
		"data from a share":   strings.Replace(base, `{ destination = "/cache", kind = "tmpfs" },`, `{ destination = "/cache", kind = "tmpfs" }, { destination = "/config", kind = "shared", read_only = true },`, 1),
		"an exact script":     strings.Replace(base, `exec = [["/app", "healthcheck"]]`, `exec = [["sh", "-c", "cat /config/x"]]`+"\nexec_stdin = true", 1),
		"a pattern argument":  strings.Replace(base, `exec = [["/app", "healthcheck"]]`, `exec = [["wget", "-O-", "re:http://10[.]0[.]0[.][0-9]+/"]]`, 1),
		"a program pattern":   strings.Replace(base, `exec = [["/app", "healthcheck"]]`, `exec = [["re:/app/(check|ready)"]]`, 1),
		"a host file, noexec": strings.Replace(base, `{ destination = "/cache", kind = "tmpfs" },`, `{ destination = "/cache", kind = "tmpfs" }, { destination = "/usr/local/bin", kind = "file" },`, 1),
	} {
		d, err := Parse(policyDoc(t, policy))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if can, reason := d.HostCanRunCode(); can {
			t.Errorf("%s: HostCanRunCode = true, %q", name, reason)
		}
	}
}
