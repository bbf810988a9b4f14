package initdata

import (
	"crypto/sha256"
	"crypto/sha512"
	"strings"
	"testing"
)

// specExample is the TOML example of trustee kbs/docs/initdata.md
// ("Initdata Digest Calculating"), byte for byte.
const specExample = `algorithm = "sha384"
version = "0.1.0"

[data]
"key1" = '''value1'''
"key2" = '''value2'''
`

// The digest is the named hash over the whole document, cut to 32 bytes
// for HOST_DATA and kept whole (48 bytes) for MRCONFIGID.
func TestCoCoDigestSHA384(t *testing.T) {
	if !IsCoCo([]byte(specExample)) {
		t.Fatal("the specification's example is not detected as CoCo init data")
	}
	full := sha512.Sum384([]byte(specExample))
	if got := Digest([]byte(specExample)); string(got[:]) != string(full[:32]) {
		t.Fatalf("HOST_DATA %x, want the first 32 bytes of sha384 %x", got, full)
	}
	if got := DigestTDX([]byte(specExample)); got != full {
		t.Fatalf("MRCONFIGID %x, want sha384 %x", got, full)
	}
	c, err := ParseCoCo([]byte(specExample))
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != "0.1.0" || c.Algorithm != "sha384" || c.Data["key1"] != "value1" || c.Data["key2"] != "value2" {
		t.Fatalf("parsed %+v", c)
	}
	// No c8s.toml: the default policy, no broker.
	d, err := Parse([]byte(specExample))
	if err != nil || d.Format != FormatCoCo || !d.Agent.ExecAllowed() || d.KBS.URL != "" {
		t.Fatalf("Parse = %+v, %v", d, err)
	}
}

// sha256 fills HOST_DATA exactly and is zero-padded to 48 bytes for
// MRCONFIGID; sha512 is cut to both.
func TestCoCoDigestPadTruncate(t *testing.T) {
	doc256 := strings.Replace(specExample, "sha384", "sha256", 1)
	s256 := sha256.Sum256([]byte(doc256))
	if got := Digest([]byte(doc256)); got != s256 {
		t.Fatalf("HOST_DATA %x, want sha256 %x", got, s256)
	}
	var want48 [48]byte
	copy(want48[:], s256[:])
	if got := DigestTDX([]byte(doc256)); got != want48 || got[47] != 0 || got[32] != 0 {
		t.Fatalf("MRCONFIGID %x, want sha256 followed by 16 zero bytes", got)
	}
	doc512 := strings.Replace(specExample, "sha384", "sha512", 1)
	s512 := sha512.Sum512([]byte(doc512))
	if got := Digest([]byte(doc512)); string(got[:]) != string(s512[:32]) {
		t.Fatalf("HOST_DATA %x, want the first 32 bytes of sha512", got)
	}
	if got := DigestTDX([]byte(doc512)); string(got[:]) != string(s512[:48]) {
		t.Fatalf("MRCONFIGID %x, want the first 48 bytes of sha512", got)
	}
	// Every byte counts: one more newline is another digest.
	if Digest([]byte(doc256+"\n")) == s256 {
		t.Fatal("the digest ignores trailing bytes")
	}
}

// c8s's own format keeps its digests.
func TestC8sFormatDigestUnchanged(t *testing.T) {
	doc := []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	if IsCoCo(doc) {
		t.Fatal("c8s init data detected as CoCo")
	}
	if Digest(doc) != sha256.Sum256(doc) || DigestTDX(doc) != sha512.Sum384(doc) {
		t.Fatal("c8s init data digest changed")
	}
	d, err := Parse(doc)
	if err != nil || d.Format != FormatC8s || d.Agent.ExecAllowed() {
		t.Fatalf("Parse = %+v, %v", d, err)
	}
}

func TestParseCoCoRefuses(t *testing.T) {
	for _, c := range []struct{ doc, err string }{
		{strings.Replace(specExample, `"0.1.0"`, `"0.1"`, 1), "version"},
		{strings.Replace(specExample, "sha384", "sha-384", 1), "algorithm"},
		{strings.Replace(specExample, "sha384", "sm3", 1), "algorithm"},
		{"version = \"0.1.0\"\n[data]\nk = 'v'\n", "algorithm"},
		{"extra = 1\n" + specExample, "extra"},
		{strings.Replace(specExample, `'''value2'''`, `2`, 1), "data"},
		// A Kata agent policy that c8s would not evaluate.
		{specExample + "\"policy.rego\" = '''\npackage agent_policy\ndefault ExecProcessRequest := false\n'''\n", "policy.rego"},
		// c8s.toml is read strictly.
		{specExample + "\"c8s.toml\" = '''\n[agent_policy]\nallow_exek = false\n'''\n", "allow_exek"},
	} {
		if _, err := Parse([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Parse(%q) = %v, want an error naming %q", c.doc, err, c.err)
		}
	}
}

// c8s's settings come from the c8s.toml entry; the broker, when c8s.toml
// names secrets but none, from CoCo's cdh.toml ([kbc]) or aa.toml
// ([token_configs.kbs]).
func TestParseCoCoC8sEntry(t *testing.T) {
	cert := selfSignedPEM(t)
	c8s := "\"c8s.toml\" = '''\n[agent_policy]\nallow_exec = false\n[[kbs.secrets]]\nresource = \"kbs:///default/key/db-password\"\npath = \"/run/secrets/db\"\n'''\n"
	cdh := "\"cdh.toml\" = '''\n[kbc]\nname = \"cc_kbc\"\nurl = \"https://kbs.example:8080\"\nkbs_cert = \"\"\"\n" + cert + "\"\"\"\n'''\n"
	aa := "\"aa.toml\" = '''\n[token_configs]\n[token_configs.kbs]\nurl = \"https://aa-kbs.example:8080\"\ncert = \"\"\"\n" + cert + "\"\"\"\n'''\n"
	head := "version = \"0.1.0\"\nalgorithm = \"sha256\"\n[data]\n"

	d, err := Parse([]byte(head + c8s + cdh + aa))
	if err != nil {
		t.Fatal(err)
	}
	if d.Agent.ExecAllowed() || d.KBS.URL != "https://kbs.example:8080" || len(d.KBS.Secrets) != 1 || d.KBS.Secrets[0].Path != "/run/secrets/db" {
		t.Fatalf("from c8s.toml + cdh.toml: %+v", d)
	}
	if d, err = Parse([]byte(head + c8s + aa)); err != nil || d.KBS.URL != "https://aa-kbs.example:8080" {
		t.Fatalf("from c8s.toml + aa.toml: %+v, %v", d, err)
	}
	// c8s.toml's own broker wins.
	own := strings.Replace(c8s, "[[kbs.secrets]]", "[kbs]\nurl = \"https://own.example\"\ncert = \"\"\"\n"+cert+"\"\"\"\n[[kbs.secrets]]", 1)
	if d, err = Parse([]byte(head + own + cdh)); err != nil || d.KBS.URL != "https://own.example" {
		t.Fatalf("c8s.toml's own broker: %+v, %v", d, err)
	}
	// Secrets with no broker anywhere are refused.
	if _, err := Parse([]byte(head + c8s)); err == nil || !strings.Contains(err.Error(), "kbs.url") {
		t.Fatalf("secrets without a broker: %v", err)
	}
	// A plain-http CoCo broker is not used for c8s's secrets.
	insecure := strings.Replace(cdh, "https://kbs.example:8080", "http://kbs.example:8080", 1)
	if _, err := Parse([]byte(head + c8s + insecure)); err == nil || !strings.Contains(err.Error(), "https") {
		t.Fatalf("an http broker: %v", err)
	}
	// Without secrets, CoCo's own broker settings are left alone.
	if d, err = Parse([]byte(head + insecure)); err != nil || d.KBS.URL != "" {
		t.Fatalf("no secrets: %+v, %v", d, err)
	}
}

// A document with a Kata agent policy (policy.rego) is refused even when
// it also carries c8s.toml: the guest enforces only c8s's own policy, and
// silently ignoring the owner's rules would run the pod under weaker ones
// than the owner wrote.
func TestParseCoCoRefusesPolicyRego(t *testing.T) {
	rego := "\"policy.rego\" = '''\npackage agent_policy\ndefault ExecProcessRequest := false\n'''\n"
	c8s := "\"c8s.toml\" = '''\n[agent_policy]\nallow_exec = false\n'''\n"
	head := "version = \"0.1.0\"\nalgorithm = \"sha256\"\n[data]\n"
	for name, doc := range map[string]string{"alone": head + rego, "with c8s.toml": head + c8s + rego} {
		_, err := Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), "policy.rego") || !strings.Contains(err.Error(), "c8s.toml") {
			t.Errorf("%s: Parse = %v, want an error naming policy.rego and c8s.toml", name, err)
		}
	}
	if _, err := Parse([]byte(head + c8s)); err != nil {
		t.Errorf("c8s.toml alone: %v", err)
	}
}
