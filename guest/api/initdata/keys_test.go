package initdata

import (
	"strings"
	"testing"
)

// A key spelled in another case than the specification's: go-toml would
// read it into the field, the last one winning, while CoCo's parsers and
// a relying party that looks keys up as written read the other. Each
// document is refused, naming the key and its spelling.
func TestMaliciousHostCaseFoldedKeys(t *testing.T) {
	const c8sStrict = `version = "0.1"
[agent_policy]
allow_exec = false
`
	for name, tc := range map[string]struct{ doc, key string }{
		"coco data table twice": {
			"algorithm = \"sha384\"\nversion = \"0.1.0\"\n[data]\n\"c8s.toml\" = '''\n" + c8sStrict + "'''\n[Data]\n\"c8s.toml\" = '''\nversion = \"0.1\"\n'''\n", `"Data"`},
		"coco algorithm twice": {
			"algorithm = \"sha384\"\nAlgorithm = \"sha256\"\nversion = \"0.1.0\"\n[data]\n", `"Algorithm"`},
		"c8s key twice":             {c8sStrict + "ALLOW_EXEC = true\n", `"agent_policy.ALLOW_EXEC"`},
		"c8s table in another case": {"version = \"0.1\"\n[Agent_Policy]\nallow_exec = true\n", `"Agent_Policy"`},
		// go-toml lowercases keys: "İ" (U+0130) becomes "i", which
		// Unicode's simple folding does not say.
		"dotted capital I": {"version = \"0.1\"\n[agent_policy]\nallow_exec = false\n[\"agent_pol\u0130cy\"]\nallow_exec = true\n", "agent_pol\u0130cy"},
		"Kelvin sign":      {"version = \"0.1\"\n[\"\u212Abs\"]\nurl = \"https://kbs.example\"\n", "\u212Abs"},
		"dotted capital I in a rule": {
			"version = \"0.1\"\n[policy.containers.app]\nimage = \"x\"\nargs = [\"/app\"]\nworking_dir = \"/\"\nuid = 0\ngid = 0\n\"pr\u0130vileged\" = true\n", "pr\u0130vileged"},
		"policy rule key": {
			"version = \"0.1\"\n[policy.containers.app]\nimage = \"x\"\nargs = [\"/app\"]\nworking_dir = \"/\"\nuid = 0\ngid = 0\nExec = [[\"sh\"]]\n", `"policy.containers.app.Exec"`},
		"secret in an array of tables": {
			"version = \"0.1\"\n[kbs]\nurl = \"https://kbs.example\"\n[[kbs.secrets]]\nresource = \"kbs:///a/b/c\"\nPath = \"/x\"\npath = \"/y\"\n", `"kbs.secrets.0.Path"`},
		"coco cdh.toml": {
			"algorithm = \"sha384\"\nversion = \"0.1.0\"\n[data]\n\"c8s.toml\" = '''\nversion = \"0.1\"\n[[kbs.secrets]]\nresource = \"kbs:///a/b/c\"\npath = \"/x\"\n'''\n\"cdh.toml\" = '''\n[kbc]\nname = \"cc_kbc\"\nurl = \"https://owner.example\"\n[KBC]\nurl = \"https://host.example\"\n'''\n", `"KBC"`},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), "case-sensitive") {
			t.Errorf("%s: Parse err = %v, want the key %s refused as another case", name, err, tc.key)
		}
	}
	// A table whose keys are names keeps them as written.
	doc := "version = \"0.1\"\n[policy.containers.App]\nimage = \"x\"\nargs = [\"/app\"]\nworking_dir = \"/\"\nuid = 0\ngid = 0\n"
	d, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Policy.Containers["App"]; !ok {
		t.Errorf("containers = %v, want App as written", d.Policy.Containers)
	}
}
