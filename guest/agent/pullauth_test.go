package agent

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/policy"
)

// The registry's roots are the rule's pull_ca, else the guest image's
// bundle; with neither, an HTTPS pull fails naming pull_ca.
func TestPullRoots(t *testing.T) {
	srv := httptest.NewTLSServer(nil)
	defer srv.Close()
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	img := policy.PullImage{Ref: policyapi.PullRef{Registry: "r", Repository: "app", Digest: "sha256:" + strings.Repeat("0", 64)}}

	old := pullCABundle
	defer func() { pullCABundle = old }()
	pullCABundle = filepath.Join(t.TempDir(), "none.crt")
	if _, err := pullRoots(img); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "pull_ca") {
		t.Fatalf("no pull_ca, no bundle: %v", err)
	}

	img.CA = caPEM
	roots, err := pullRoots(img)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Certificate().Verify(verifyOpts(roots)); err != nil {
		t.Fatalf("the pull_ca pool does not verify the registry: %v", err)
	}

	// The bundle, when the rule names no CA; pull_ca, when it does, alone.
	bundle := filepath.Join(t.TempDir(), "ca-certificates.crt")
	if err := os.WriteFile(bundle, []byte(caPEM), 0o644); err != nil {
		t.Fatal(err)
	}
	pullCABundle = bundle
	img.CA = ""
	if roots, err = pullRoots(img); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Certificate().Verify(verifyOpts(roots)); err != nil {
		t.Fatalf("the bundle does not verify the registry: %v", err)
	}
}

// Resources that only pull_auth names are left to the pull; a resource a
// rule also mounts as a secret is fetched with the pod's secrets.
func TestPullOnlyCredentials(t *testing.T) {
	doc := &initdata.InitData{Policy: &policyapi.Policy{Containers: map[string]*policyapi.Container{
		"a": {PullAuth: "kbs:///default/registry/a"},
		"b": {PullAuth: "default/registry/b", Secrets: []policyapi.Secret{{Resource: "kbs:///default/registry/b"}}},
		"c": {Secrets: []policyapi.Secret{{Resource: "kbs:///default/key/c"}}},
	}}}
	got := pullOnlyCredentials(doc)
	if len(got) != 1 || !got["default/registry/a"] {
		t.Fatalf("pullOnlyCredentials = %v, want only default/registry/a", got)
	}
	if pullOnlyCredentials(&initdata.InitData{}) != nil {
		t.Fatal("a document without a [policy] has pull-only credentials")
	}
}

func verifyOpts(roots *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: roots}
}

// The pod starts without asking the broker for registry credentials only
// pull_auth names: the pull asks when it needs them, so a broker that
// refuses them fails that pull, not the pod.
func TestSetInitDataLeavesPullCredentialsToThePull(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusForbidden)
	}))
	defer srv.Close()
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	doc := fmt.Appendf(nil, `version = "0.1"
[kbs]
url = %q
cert = '''
%s'''
[[kbs.secrets]]
resource = "kbs:///default/registry/creds"
path = "/run/secrets/registry"

[policy.containers.app]
image = "x"
args = ["/app"]
working_dir = "/"
uid = 0
gid = 0
pull = "10.0.0.1:5000/app@sha256:%s"
pull_auth = "kbs:///default/registry/creds"
`, srv.URL, cert, strings.Repeat("ab", 32))
	svc := snpService(t, doc)
	if _, err := svc.SetInitData(context.Background(), &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatalf("SetInitData: %v", err)
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("the broker saw %d requests at the pod's start", n)
	}
	if entries, _ := os.ReadDir(svc.cfg.SecretsDir); len(entries) != 0 {
		t.Fatalf("the secrets dir has %d entries: registry credentials kept on it", len(entries))
	}
}

// Two rules that pull one image with other credentials or roots are two
// pulls: neither stands for the other.
func TestPullKeyTellsCredentialsApart(t *testing.T) {
	a := policy.PullImage{Ref: policyapi.PullRef{Registry: "r", Repository: "app", Digest: "sha256:" + strings.Repeat("0", 64)}, Auth: "kbs:///default/registry/a"}
	b, c, same := a, a, a
	b.Auth = "kbs:///default/registry/b"
	c.CA = "a CA"
	if pullKey(a) == pullKey(b) || pullKey(a) == pullKey(c) || pullKey(a) != pullKey(same) {
		t.Fatalf("pullKey: %q %q %q", pullKey(a), pullKey(b), pullKey(c))
	}
}
