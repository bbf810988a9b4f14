package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	guestkbs "github.com/c8s-dev/c8s/guest/kbs"
	"github.com/c8s-dev/c8s/launcher/broker"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
)

// ownerEnv is a node (a sim secure processor, a config and its image
// manifest), an owner's files, and a pod whose reports the node's SP
// signs, served by whichever broker newKBSBroker builds.
type ownerEnv struct {
	dir         string
	sp          *sim.SP
	spDir       string
	measurement [48]byte // what the pod's reports carry
	nodeConfig  string   // the node's config, whose manifest has the pod's measurement
	podDoc      string   // the pod's init data file
	url         string
	roots       *x509.CertPool
	mu          sync.Mutex
	handler     http.Handler
}

func newOwnerEnv(t *testing.T) *ownerEnv {
	t.Helper()
	e := &ownerEnv{dir: t.TempDir(), spDir: t.TempDir()}
	var err error
	if e.sp, err = sim.Open(e.spDir); err != nil {
		t.Fatal(err)
	}
	if _, err := rand.Read(e.measurement[:]); err != nil {
		t.Fatal(err)
	}
	// The broker's TLS endpoint first: the pod's init data pins it.
	certPEM, keyPEM, err := broker.SelfSigned([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		h := e.handler
		e.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	e.url = srv.URL
	e.roots = x509.NewCertPool()
	e.roots.AppendCertsFromPEM(certPEM)
	e.podDoc = e.write(t, "pod.toml", fmt.Sprintf(`version = "0.1"
[kbs]
url = %q
cert = """
%s"""
[[kbs.secrets]]
resource = "kbs:///default/key/db-password"
path = "/run/secrets/db-password"
[policy]
[policy.containers.app]
image = "registry.example/app:1"
args = ["/app"]
working_dir = "/"
uid = 1000
gid = 1000
%s`, e.url, certPEM, appLayers))
	nodeManifest := e.write(t, "node-manifest.json", string(manifestFor(t, e.measurement[:])))
	e.nodeConfig = e.write(t, "node.toml", fmt.Sprintf("[hypervisor]\ntee = \"sim\"\n[attestation]\nmanifest = %q\n[runtime]\nstate_dir = %q\n", nodeManifest, e.dir))
	return e
}

func (e *ownerEnv) write(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// manifestFor is an image manifest whose sim digest for one vCPU is m.
func manifestFor(t *testing.T, m []byte) []byte {
	t.Helper()
	sum := strings.Repeat("ab", 32)
	mf := &manifest.Manifest{Schema: manifest.Schema, Artifacts: map[string]manifest.Artifact{
		manifest.RoleKernel: {File: "vmlinuz", Size: 1, SHA256: sum},
		manifest.RoleInitrd: {File: "initrd.img", Size: 1, SHA256: sum},
	}}
	if err := mf.SetSim(manifest.SimDigests{ByVCPUs: map[string]string{"1": hex.EncodeToString(m)}}); err != nil {
		t.Fatal(err)
	}
	b, err := mf.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fetch builds the broker o describes, serves the secret with it and has
// the pod ask for it; it returns newKBSBroker's error or the fetch's.
func (e *ownerEnv) fetch(t *testing.T, o kbsFlags) (string, error) {
	t.Helper()
	b, _, err := newKBSBroker(o, io.Discard)
	if err != nil {
		return "", err
	}
	b.Resources = broker.Map{"default/key/db-password": []byte("s3cret")}
	e.mu.Lock()
	e.handler = b
	e.mu.Unlock()
	doc, err := os.ReadFile(e.podDoc)
	if err != nil {
		t.Fatal(err)
	}
	c := &guestkbs.Client{URL: e.url, Roots: e.roots, Tee: kbsapi.TeeSNP, InitData: doc,
		Evidence: func(_ context.Context, rd [64]byte) (string, []byte, error) {
			report, err := e.sp.Report(sim.Request{Measurement: e.measurement, HostData: initdata.Digest(doc), ReportData: rd})
			if err != nil {
				return "", nil, err
			}
			ev, err := kbsapi.NewSNPEvidence(report, e.sp.CertTable())
			if err != nil {
				return "", nil, err
			}
			raw, err := json.Marshal(ev)
			return kbsapi.TeeSNP, raw, err
		}}
	got, err := c.Fetch(t.Context(), []string{"default/key/db-password"})
	if err != nil {
		return "", err
	}
	return string(got[0]), nil
}

// In owner mode the node's config and manifest are not read: a
// measurement only the node's manifest has is refused; the owner's
// reference values decide.
func TestKBSNodeManifestCannotWiden(t *testing.T) {
	e := newOwnerEnv(t)
	other := make([]byte, 48)
	if _, err := rand.Read(other); err != nil {
		t.Fatal(err)
	}
	ownerOther := e.write(t, "owner-other.json", string(manifestFor(t, other)))
	ownerPod := e.write(t, "owner-pod.json", string(manifestFor(t, e.measurement[:])))
	owner := func(refs ...string) kbsFlags {
		return kbsFlags{tee: "sim", simDir: e.spDir, referenceValues: refs, initData: stringList{e.podDoc}, configPath: e.nodeConfig}
	}

	// The node's manifest has the pod's measurement; the owner's has not.
	_, err := e.fetch(t, owner(ownerOther))
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "measurement mismatch") || !strings.Contains(err.Error(), hex.EncodeToString(e.measurement[:])) {
		t.Fatalf("a measurement only the node's manifest has: err = %v, want a 401 measurement mismatch", err)
	}
	// The controls: the owner's manifest with the pod's image; the node's
	// manifest under the development flag.
	if got, err := e.fetch(t, owner(ownerOther, ownerPod)); err != nil || got != "s3cret" {
		t.Fatalf("the pod's image among the owner's reference values: %q, %v", got, err)
	}
	if got, err := e.fetch(t, kbsFlags{fromNode: true, simDir: e.spDir, initData: stringList{e.podDoc}, configPath: e.nodeConfig}); err != nil || got != "s3cret" {
		t.Fatalf("--reference-values-from-node: %q, %v", got, err)
	}
	// The node's min_tcb and allow_debug are not read either: a node
	// config allowing debug does not let a debug guest through.
	if err := os.WriteFile(e.nodeConfig, []byte(fmt.Sprintf("[hypervisor]\ntee = \"sim\"\n[attestation]\nallow_debug = true\n[runtime]\nstate_dir = %q\n", e.dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	b, _, err := newKBSBroker(owner(ownerPod), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if b.Policy.AllowDebug || b.Policy.MinTCB != 0 || len(b.References) != 1 || b.References[0].Source != ownerPod {
		t.Fatalf("owner mode took node settings: policy %+v, references %+v", b.Policy, b.References)
	}
}

// The owner's resource policy is loaded and applied, and its workloads'
// init data are pinned.
func TestKBSResourcePolicyFlag(t *testing.T) {
	e := newOwnerEnv(t)
	ref := e.write(t, "owner.json", string(manifestFor(t, e.measurement[:])))
	doc, err := os.ReadFile(e.podDoc)
	if err != nil {
		t.Fatal(err)
	}
	d := initdata.Digest(doc)
	policy := func(digest string) string {
		return e.write(t, "resources.toml", fmt.Sprintf("[workloads.app]\ninit_data = [%q]\n[[resources]]\nname = \"db\"\npath = \"default/key/db-password\"\nworkloads = [\"app\"]\n", digest))
	}
	o := kbsFlags{tee: "sim", simDir: e.spDir, referenceValues: stringList{ref}, resourcePolicy: policy(hex.EncodeToString(d[:]))}
	if got, err := e.fetch(t, o); err != nil || got != "s3cret" {
		t.Fatalf("the workload the policy names (pinned by it, no --init-data): %q, %v", got, err)
	}
	o.initData, o.resourcePolicy = stringList{e.podDoc}, policy(strings.Repeat("77", 32))
	if _, err := e.fetch(t, o); err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), `not in resource policy rule "db"`) {
		t.Fatalf("another workload's resource: err = %v, want a 403 naming the rule", err)
	}
}

func TestKBSOwnerFlagsRefused(t *testing.T) {
	e := newOwnerEnv(t)
	ref := e.write(t, "owner.json", string(manifestFor(t, e.measurement[:])))
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := e.write(t, "owner.pub", string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})))
	pins := stringList{e.podDoc}
	for name, tc := range map[string]struct {
		o    kbsFlags
		want []string
	}{
		"no reference values": {kbsFlags{initData: pins, configPath: e.nodeConfig},
			[]string{"--reference-values FILE", "--policy FILE", "--reference-values-from-node", "development only"}},
		"node and owner": {kbsFlags{initData: pins, referenceValues: stringList{ref}, fromNode: true},
			[]string{"--reference-values-from-node cannot be combined"}},
		"no TEE": {kbsFlags{initData: pins, referenceValues: stringList{ref}, configPath: e.nodeConfig},
			[]string{"--tee snp|tdx|sim is required", "the node's config is not read"}},
		"sim without its root": {kbsFlags{initData: pins, referenceValues: stringList{ref}, tee: "sim"},
			[]string{"--tee sim needs --sim-dir"}},
		"unsigned reference values": {kbsFlags{initData: pins, referenceValues: stringList{ref}, tee: "sim", simDir: e.spDir, referenceKey: keyFile},
			[]string{ref, "its signature"}},
		"a bad signature": {kbsFlags{initData: pins, referenceValues: stringList{ref}, tee: "sim", simDir: e.spDir, referenceKey: keyFile},
			[]string{ref, "does not verify under the owner's reference key"}},
	} {
		t.Run(name, func(t *testing.T) {
			if name == "a bad signature" {
				e.write(t, "owner.json"+broker.SignatureSuffix, string(ed25519.Sign(priv, []byte("another file"))))
				defer os.Remove(ref + broker.SignatureSuffix)
			}
			_, _, err := newKBSBroker(tc.o, io.Discard)
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want %q", err, w)
				}
			}
		})
	}
	// The owner's signature over the file: accepted.
	e.write(t, "owner.json"+broker.SignatureSuffix, string(ed25519.Sign(priv, must(os.ReadFile(ref)))))
	if _, _, err := newKBSBroker(kbsFlags{initData: pins, referenceValues: stringList{ref}, tee: "sim", simDir: e.spDir, referenceKey: keyFile}, io.Discard); err != nil {
		t.Fatalf("signed by the owner: %v", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
