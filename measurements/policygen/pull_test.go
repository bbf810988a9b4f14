package policygen

import (
	"encoding/pem"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/guest/api/initdata"
)

// --pull writes the container's digest-pinned image as the rule's pull
// reference, which initdata.Parse reads back.
func TestPull(t *testing.T) {
	rs, err := Generate([]byte(pod(pinned)), Options{Pull: map[string]Pull{"app": {PlainHTTP: true}}})
	if err != nil {
		t.Fatal(err)
	}
	ref := "ghcr.io/example/app@sha256:" + strings.Repeat("ab", 32)
	doc, err := initdata.Parse(rs[0].InitData)
	if err != nil {
		t.Fatal(err)
	}
	c := doc.Policy.Containers["app"]
	if c.Pull != ref || !c.PullPlainHTTP || c.PullAuth != "" || !c.BindsImage() {
		t.Fatalf("rule pull = %q plain_http %v auth %q:\n%s", c.Pull, c.PullPlainHTTP, c.PullAuth, rs[0].InitData)
	}
	if !strings.Contains(string(rs[0].InitData), "pull = \""+ref+"\"  # the guest pulls and verifies") {
		t.Errorf("no commented pull line:\n%s", rs[0].InitData)
	}
}

func TestPullRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		yaml string
		o    Options
		want string
	}{
		"a tag": {strings.Replace(pod(pinned), "@sha256:"+strings.Repeat("ab", 32), ":1.0", 1), Options{Pull: map[string]Pull{"app": {}}},
			`container app: the guest pulls only a digest-pinned image: "ghcr.io/example/app:1.0" is not pinned by digest`},
		"no such container": {pod(pinned), Options{Pull: map[string]Pull{"db": {}}}, `--pull names container "db"`},
		"credentials over plain HTTP": {pod(pinned), Options{Pull: map[string]Pull{"app": {PlainHTTP: true, Auth: "kbs:///a/registry/auth"}}},
			"credentials are never sent over plain HTTP"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Generate([]byte(c.yaml), c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}

// --pull-ca writes the registry's CA as the rule's pull_ca, exactly.
func TestPullCA(t *testing.T) {
	srv := httptest.NewTLSServer(nil)
	defer srv.Close()
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	kbsCert, err := os.ReadFile("testdata/kbs.pem")
	if err != nil {
		t.Fatal(err)
	}
	broker := initdata.KBS{URL: "https://kbs.example:8080", Cert: string(kbsCert)}
	rs, err := Generate([]byte(pod(pinned)), Options{KBS: broker, Pull: map[string]Pull{"app": {Auth: "kbs:///a/registry/auth", CA: ca}}})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := initdata.Parse(rs[0].InitData)
	if err != nil {
		t.Fatal(err)
	}
	if c := doc.Policy.Containers["app"]; c.PullCA != ca || c.PullAuth != "kbs:///a/registry/auth" {
		t.Fatalf("pull_ca = %q:\n%s", c.PullCA, rs[0].InitData)
	}
	// The broker releases a pod only what its [[kbs.secrets]] list.
	if s := doc.KBS.Secrets; len(s) != 1 || s[0].Resource != "kbs:///a/registry/auth" {
		t.Fatalf("kbs.secrets = %+v, want the credentials listed", s)
	}
	if _, err := Generate([]byte(pod(pinned)), Options{Pull: map[string]Pull{"app": {Auth: "kbs:///a/registry/auth"}}}); err == nil || !strings.Contains(err.Error(), "--kbs-url") {
		t.Errorf("credentials without a broker: %v", err)
	}
	for name, o := range map[string]Pull{
		"not PEM":         {CA: "a CA"},
		"with plain HTTP": {CA: ca, PlainHTTP: true},
	} {
		if _, err := Generate([]byte(pod(pinned)), Options{Pull: map[string]Pull{"app": o}}); err == nil || !strings.Contains(err.Error(), "container app:") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}
