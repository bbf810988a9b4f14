package initdata

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	d, err := Parse(nil)
	if err != nil || !d.Agent.ExecAllowed() {
		t.Fatalf("empty init data: %+v, %v; want the default policy", d, err)
	}
	d, err = Parse([]byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n"))
	if err != nil || d.Agent.ExecAllowed() {
		t.Fatalf("allow_exec = false: %+v, %v", d, err)
	}
	for doc, want := range map[string]string{
		"version = \"0.1\"\n[agent_policy]\nallow_exek = false\n": "allow_exek",
		"version = \"9\"\n":                 "version \"9\"",
		"[agent_policy\n":                   "init data",
		"version = \"0.1\"\nallow_exec = 1": "allow_exec",
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error mentioning %q", doc, err, want)
		}
	}
}

func TestDigest(t *testing.T) {
	if Digest(nil) != [32]byte{} {
		t.Fatal("empty init data must give an all-zero HOST_DATA")
	}
	a, b := Digest([]byte("version = \"0.1\"\n")), Digest([]byte("version = \"0.1\"\n\n"))
	if a == b || a == [32]byte{} {
		t.Fatal("the digest must cover every byte of the document")
	}
}

const testCert = `-----BEGIN CERTIFICATE-----
MIIBUjCB+qADAgECAhAXDTkSpJ4Z0SVTqJxJJJbXMAoGCCqGSM49BAMCMBkxFzAV
BgNVBAMTDmM4cyBrZXkgYnJva2VyMB4XDTI2MTEyOTIxMDAwMFoXDTI3MTEyOTIx
MDAwMFowGTEXMBUGA1UEAxMOYzhzIGtleSBicm9rZXIwWTATBgcqhkjOPQIBBggq
hkjOPQMBBwNCAAQ=
-----END CERTIFICATE-----`

func TestParseKBS(t *testing.T) {
	doc := "version = \"0.1\"\n[kbs]\nurl = \"https://kbs.example:8443\"\ncert = '''\nCERT'''\n[[kbs.secrets]]\nresource = \"kbs:///default/key/db-password\"\npath = \"/run/secrets/db\"\n"
	// A certificate that does not parse is refused.
	if _, err := Parse([]byte(strings.Replace(doc, "CERT", testCert, 1))); err == nil || !strings.Contains(err.Error(), "kbs.cert") {
		t.Fatalf("a broken certificate: err = %v", err)
	}
	k := KBS{URL: "https://kbs.example", Secrets: []Secret{{Resource: "default/key/x", Path: "/s"}}}
	if a, err := k.Address(); err != nil || a != "kbs.example:443" {
		t.Fatalf("Address() = %q, %v", a, err)
	}
	for res, want := range map[string]string{
		"kbs:///default/key/db-password":     "default/key/db-password",
		"kbs://ignored.host/default/key/tag": "default/key/tag",
		"repo/type/tag":                      "repo/type/tag",
	} {
		if got, err := (Secret{Resource: res}).ResourcePath(); err != nil || got != want {
			t.Errorf("ResourcePath(%q) = %q, %v; want %q", res, got, err, want)
		}
	}
	for _, res := range []string{"default/key", "kbs:///a/../b", "a/b/c/d", "a//c", "kbs:nope"} {
		if _, err := (Secret{Resource: res}).ResourcePath(); err == nil {
			t.Errorf("ResourcePath(%q) accepted", res)
		}
	}
	for _, bad := range []KBS{
		{URL: "http://kbs.example"},
		{URL: "https://"},
		{Secrets: []Secret{{Resource: "a/b/c", Path: "/x"}}},
	} {
		if err := bad.validate(); err == nil {
			t.Errorf("validate(%+v) accepted", bad)
		}
	}
}

func selfSignedPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestParseKBSSecretPaths(t *testing.T) {
	doc := func(paths ...string) []byte {
		s := "version = \"0.1\"\n[kbs]\nurl = \"https://127.0.0.1:8443\"\ncert = '''\n" + selfSignedPEM(t) + "'''\n"
		for i, p := range paths {
			s += fmt.Sprintf("[[kbs.secrets]]\nresource = \"default/key/k%d\"\npath = %q\n", i, p)
		}
		return []byte(s)
	}
	d, err := Parse(doc("/run/secrets/a", "/etc/b"))
	if err != nil || len(d.KBS.Secrets) != 2 || d.KBS.Secrets[1].Path != "/etc/b" {
		t.Fatalf("Parse = %+v, %v", d, err)
	}
	if _, err := d.KBS.CertPool(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{{"relative"}, {"/"}, {"/a/../b"}, {"/a", "/a"}} {
		if _, err := Parse(doc(bad...)); err == nil {
			t.Errorf("paths %q accepted", bad)
		}
	}
}

func TestParseAllowDevices(t *testing.T) {
	d, err := Parse(nil)
	if err != nil || d.Agent.DevicesRestricted() {
		t.Fatalf("no init data: %+v, %v; want devices unrestricted", d, err)
	}
	d, err = Parse([]byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n"))
	if err != nil || !d.Agent.DevicesRestricted() || len(d.Agent.DeviceRules()) != 0 {
		t.Fatalf("init data without allow_devices: %+v, %v; want restricted to none", d, err)
	}
	d, err = Parse([]byte("version = \"0.1\"\n[agent_policy]\nallow_devices = [\"c 10:200\", \"c 13:*\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	rules := d.Agent.DeviceRules()
	if len(rules) != 2 || !rules[0].Matches(10, 200) || rules[0].Matches(10, 201) || !rules[1].Matches(13, 99) || rules[1].String() != "c 13:*" {
		t.Fatalf("rules = %+v", rules)
	}
	for doc, want := range map[string]string{
		`allow_devices = ["b 8:0"]`:  "block devices",
		`allow_devices = ["c 10"]`:   "MAJOR:MINOR",
		`allow_devices = ["c *:*"]`:  "major",
		`allow_devices = ["/dev/x"]`: "not a device type",
		`allow_devices = ["c 1:x"]`:  "minor",
		`allow_devices = "c 1:3"`:    "AllowDevices",
	} {
		_, err := Parse([]byte("version = \"0.1\"\n[agent_policy]\n" + doc + "\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want one naming %q", doc, err, want)
		}
	}
	// CoCo init data: c8s.toml's policy, restricted even without one.
	d, err = Parse([]byte("version = \"0.1.0\"\nalgorithm = \"sha256\"\n[data]\n\"c8s.toml\" = '''\n[agent_policy]\nallow_devices = [\"c 10:229\"]\n'''\n"))
	if err != nil || !d.Agent.DevicesRestricted() || len(d.Agent.DeviceRules()) != 1 {
		t.Fatalf("CoCo init data: %+v, %v", d, err)
	}
	d, err = Parse([]byte("version = \"0.1.0\"\nalgorithm = \"sha256\"\n[data]\n\"aa.toml\" = ''\n"))
	if err != nil || !d.Agent.DevicesRestricted() {
		t.Fatalf("CoCo init data without c8s.toml: %+v, %v; want devices restricted", d, err)
	}
}

// A document of white space only has a non-zero digest, so a VM launched
// with it counts as measured, yet it would read as the allow-all default:
// a host could launch a pod so and pass for one with a policy. Refused.
func TestWhiteSpaceOnlyInitDataRefused(t *testing.T) {
	for _, doc := range []string{"\n", " ", "\t\n  \n"} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "white space") {
			t.Errorf("Parse(%q) = %v, want an error naming the white space", doc, err)
		}
	}
	if d, err := Parse(nil); err != nil || d.Policy != nil {
		t.Errorf("Parse(nil) = %v, %v; want the default", d, err)
	}
}
