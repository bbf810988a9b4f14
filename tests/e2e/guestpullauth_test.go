package e2e

// Guest pull with registry credentials from the key broker, over HTTPS
// verified against the rule's CA (issue 16): the registry, the broker's
// resource policy and the search of the host that TestGuestPull's
// subtests use.

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbs "github.com/c8s-dev/c8s/launcher/broker"
)

// authRegistry fronts a pullRegistry's storage over HTTPS, with a
// certificate of its own CA for the pod network's gateway address, and
// requires credentials through the Bearer token flow registries use: a
// request without the token gets 401 naming the token service (on the
// same TLS server), which gives a token for Basic credentials.
type authRegistry struct {
	port            int
	caPEM           []byte
	user, password  string
	token           string
	tokens, bearers atomic.Int64 // tokens issued, requests with the token
	refused         atomic.Int64 // token requests with wrong credentials
	handshakeErrors atomic.Int64 // TLS handshakes that failed
}

func startAuthRegistry(t *testing.T, r *pullRegistry) *authRegistry {
	t.Helper()
	certPEM, keyPEM, err := kbs.SelfSigned([]string{pullGateway}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	a := &authRegistry{caPEM: certPEM, user: "c8s-e2e", password: "e2e-registry-password-" + randomHex(t), token: "e2e-registry-token-" + randomHex(t)}
	l, err := tls.Listen("tcp", ":0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	a.port = l.Addr().(*net.TCPAddr).Port
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(writerFunc(func(p []byte) { a.countTLSError(p) }), "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path == "/token" {
				if u, pw, ok := req.BasicAuth(); !ok || u != a.user || pw != a.password {
					a.refused.Add(1)
					w.Header().Set("WWW-Authenticate", `Basic realm="c8s-e2e"`)
					http.Error(w, "wrong credentials", http.StatusUnauthorized)
					return
				}
				a.tokens.Add(1)
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"token": %q, "expires_in": 300}`, a.token)
				return
			}
			if req.Header.Get("Authorization") != "Bearer "+a.token {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="https://%s/token",service="c8s-e2e-registry"`, req.Host))
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
				return
			}
			a.bearers.Add(1)
			r.reg.ServeHTTP(w, req)
		}),
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *authRegistry) countTLSError(p []byte) {
	if strings.Contains(string(p), "TLS handshake error") {
		a.handshakeErrors.Add(1)
	}
}

// writerFunc is an io.Writer of a function (the server's error log).
type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

func randomHex(t *testing.T) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// creds is the registry's credentials as the key broker holds them.
func (a *authRegistry) creds() []byte {
	return []byte(fmt.Sprintf(`{"username": %q, "password": %q}`, a.user, a.password))
}

// anonymousStatus is what the registry answers a request for the
// manifest ref (REPO@DIGEST) without credentials, over TLS verified
// against its CA.
func (a *authRegistry) anonymousStatus(t *testing.T, repo, dgst string) int {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(a.caPEM)
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: pullGateway}}}
	resp, err := c.Get(fmt.Sprintf("https://127.0.0.1:%d/v2/%s/manifests/%s", a.port, repo, dgst))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Broker resources of the pull pods' registry credentials: the pod's, and
// another workload's, which the owner's resource policy keeps from it.
const (
	pullCredsResource  = "default/registry/pull-creds"
	otherCredsResource = "default/registry/other-creds"
)

// pullKBSSection is the [kbs] of the pull pods: the broker, and both
// credentials resources in [[kbs.secrets]] (a pod gets only resources its
// measured document names; no rule mounts them, so the pulls fetch them).
func pullKBSSection(b *broker) string {
	return fmt.Sprintf(`
[kbs]
url = "https://%s"
cert = '''
%s'''

[[kbs.secrets]]
resource = "kbs:///%s"
path = "/run/secrets/registry/pull-creds"

[[kbs.secrets]]
resource = "kbs:///%s"
path = "/run/secrets/registry/other-creds"
`, b.addr, b.certPEM, pullCredsResource, otherCredsResource)
}

// withKBS inserts the [kbs] section kbsSection into a pull pod document
// (before its first table).
func withKBS(doc, kbsSection string) string {
	i := strings.Index(doc, "\n[policy.")
	return doc[:i] + "\n" + kbsSection + doc[i:]
}

// pullResourcePolicy is the owner's resource policy: the pull pods' own
// credentials go to their document (on the image's launch measurement,
// which the broker's reference values check), the other credentials to another workload's document only. The pods'
// sandbox (pause) rule binds no image, which the owner accepts for them
// (allow_host_rootfs); the pulled containers bind theirs by digest.
func pullResourcePolicy(t *testing.T, docs ...string) *kbs.ResourcePolicy {
	t.Helper()
	var digests []string
	for _, d := range docs {
		dg := initdata.Digest([]byte(d))
		digests = append(digests, hex.EncodeToString(dg[:]))
	}
	other := initdata.Digest([]byte("version = \"0.1\"\n# another workload's pod\n"))
	p, err := kbs.ParseResourcePolicy([]byte(fmt.Sprintf(`
[workloads.pull-pods]
tee = ["sim"]
init_data = %s
allow_host_rootfs = true

[workloads.other]
tee = ["sim"]
init_data = [%q]

[[resources]]
name = "pull-creds"
path = %q
workloads = ["pull-pods"]

[[resources]]
name = "other-creds"
path = %q
workloads = ["other"]
`, tomlStrings(digests...), hex.EncodeToString(other[:]), pullCredsResource, otherCredsResource)), false, "")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// assertNotOnHost searches containerd's log (the shims' with it) and
// every file under the node's dirs (containerd's root and state, the c8s
// state dir with the pod VMs' console logs) for each of values. A
// control other than "" must be found (while the pod runs, its init
// data's resource name: the search reaches where the pod's data is).
func assertNotOnHost(t *testing.T, e *env, control string, values ...string) {
	t.Helper()
	found := 0
	logs := e.d.Log()
	for _, v := range values {
		if strings.Contains(logs, v) {
			t.Errorf("%.24s… is in containerd's or the shims' log", v)
		}
	}
	files := 0
	for _, dir := range []string{e.d.Dir, filepath.Dir(e.stateDir)} {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			files++
			if control != "" && bytes.Contains(data, []byte(control)) {
				found++
			}
			for _, v := range values {
				if bytes.Contains(data, []byte(v)) {
					t.Errorf("%.24s… is in %s", v, p)
				}
			}
			return nil
		})
	}
	if files == 0 || (control != "" && found == 0) {
		t.Fatalf("%d files under the node's dirs, %d with %q: the search proved nothing", files, found, control)
	}
	t.Logf("searched containerd's log and %d files under %s and %s (%d with %q)", files, e.d.Dir, filepath.Dir(e.stateDir), found, control)
}
