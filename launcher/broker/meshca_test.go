package broker

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
	guestmesh "github.com/c8s-dev/c8s/guest/mesh"
)

const meshID = "spiffe://c8s.test/ns/default/sa/app"

// meshPolicy gives meshID to workload app ($INIT: the pod's init data).
const meshPolicy = `
[workloads.app]
tee = ["sim"]
init_data = ["$INIT"]
measurements = ["$MEAS"]

[workloads.other]
init_data = ["$OTHER"]

[mesh]
trust_domain = "c8s.test"

[[mesh.identities]]
namespace = "default"
service_account = "app"
workloads = ["app"]

[[mesh.identities]]
namespace = "default"
service_account = "other"
workloads = ["other"]
`

// meshFixture is the broker fixture's pod and verifier with a mesh CA
// over TLS.
type meshFixture struct {
	*fixture
	ca     *MeshCA
	caPEM  []byte
	url    string
	tlsPEM []byte
	mu     sync.Mutex
	now    time.Time
	tamper func(rd [64]byte) [64]byte // changes the REPORT_DATA the pod's TEE signs
}

func newMeshFixture(t *testing.T) *meshFixture {
	t.Helper()
	f := &meshFixture{fixture: newFixture(t), now: time.Now()}
	certPEM, keyPEM, err := NewMeshCAKey("c8s.test", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ParseMeshCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	f.caPEM = certPEM
	f.ca = NewMeshCA(f.broker, cert, key)
	f.ca.Lifetime = time.Minute
	f.ca.Now = func() time.Time {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.now
	}
	srv, _, tlsPEM := tlsServerLogging(t, f.ca, log.WithLogger(context.Background(), logrus.NewEntry(f.logger)))
	f.url, f.tlsPEM = srv.URL, tlsPEM
	f.launch(f.meshDoc(meshID))
	f.setPolicy(t, meshPolicy)
	return f
}

// meshDoc is the fixture pod's init data (an enforced [policy]) asking
// the fixture's CA for identity.
func (f *meshFixture) meshDoc(identity string) string {
	return podInitData + fmt.Sprintf(`
[mesh]
url = %q
cert = '''
%s'''
ca = '''
%s'''
identity = %q
`, f.url, f.tlsPEM, f.caPEM, identity)
}

func (f *meshFixture) client() *guestmesh.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(f.tlsPEM)
	ca := x509.NewCertPool()
	ca.AppendCertsFromPEM(f.caPEM)
	doc, err := initdata.Parse(f.initData)
	if err != nil {
		panic(err)
	}
	id := ""
	if doc.Mesh != nil {
		id = doc.Mesh.Identity
	}
	return &guestmesh.Client{URL: f.url, Roots: roots, CA: ca, CAPEM: f.caPEM, Identity: id, InitData: f.initData,
		Evidence: func(ctx context.Context, rd [64]byte) (string, []byte, error) {
			if f.tamper != nil {
				rd = f.tamper(rd)
			}
			return f.snpEvidence(ctx, rd)
		}}
}

// refusedWith requests a certificate and wants the CA's refusal with
// status, saying each of want.
func (f *meshFixture) refusedWith(t *testing.T, status int, want ...string) {
	t.Helper()
	_, err := f.client().Request(context.Background())
	var r *guestmesh.Refused
	if !errors.As(err, &r) || r.Status != status {
		t.Fatalf("err = %v, want the CA's refusal %d", err, status)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), f.expand(w)) {
			t.Errorf("err = %v\ndoes not say %q", err, f.expand(w))
		}
	}
	if !guestmesh.Permanent(err) {
		t.Error("a refusal is not permanent")
	}
}

func TestMeshCAIssues(t *testing.T) {
	f := newMeshFixture(t)
	c, err := f.client().Request(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	leaf := c.TLS.Leaf
	if id, err := meshapi.Identity(leaf); err != nil || id != meshID || c.Identity != meshID {
		t.Fatalf("identity %q, %v; want %s", id, err, meshID)
	}
	cl, err := meshapi.ClaimsOf(leaf)
	if err != nil {
		t.Fatal(err)
	}
	digest := initdata.Digest(f.initData)
	if !bytes.Equal(cl.InitDataDigest, digest[:]) || cl.TEE != "sim" || !bytes.Equal(cl.Measurement, f.measurement[:]) {
		t.Fatalf("claims %+v: want the init data digest %x, sim, the launch measurement", cl, digest)
	}
	for _, e := range leaf.Extensions {
		if len(e.Id) > len(meshapi.OIDArc) && e.Id[:len(meshapi.OIDArc)].Equal(meshapi.OIDArc) && e.Critical {
			t.Fatalf("c8s extension %s is critical", e.Id)
		}
	}
	if got := leaf.NotAfter.Sub(f.now); got <= time.Minute-time.Second || got > time.Minute {
		t.Fatalf("lifetime %v, want the CA's 1m", got)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(f.caPEM)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: f.now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("the certificate does not chain to the mesh CA as a client: %v", err)
	}
	if !bytes.Equal(c.CAPEM, f.caPEM) || !bytes.Contains(c.KeyPEM, []byte("PRIVATE KEY")) {
		t.Fatal("the files for the workload are not the CA and key")
	}
	if !strings.Contains(f.logs.String(), "mesh CA: issued") {
		t.Fatalf("CA log: %s", f.logs.String())
	}
}

// Init data whose digest is not the evidence's, or not the owner's.
func TestMeshCAWrongInitData(t *testing.T) {
	f := newMeshFixture(t)
	launched := f.initData
	// The pod sends another document than the one it was launched with.
	c := f.client()
	c.InitData = append(append([]byte(nil), launched...), "# changed\n"...)
	if _, err := c.Request(context.Background()); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a document that is not the launched one: err = %v", err)
	}
	// Launched with, and sending, a document the owner does not pin.
	f.launch(string(launched) + "# not the owner's\n")
	f.broker.InitData = nil
	f.refusedWith(t, http.StatusUnauthorized, "is not a document the broker pins")
}

// Evidence whose REPORT_DATA does not bind the CSR's key and the nonce in
// the mesh domain.
func TestMeshCAKeyNotBound(t *testing.T) {
	f := newMeshFixture(t)
	f.tamper = func(rd [64]byte) [64]byte {
		rd[0] ^= 1
		return rd
	}
	f.refusedWith(t, http.StatusUnauthorized, "attestation refused")
	// The host's binding of the same nonce is not the mesh's either.
	f.tamper = func([64]byte) [64]byte { return reportdata.Host([]byte("nonce")) }
	f.refusedWith(t, http.StatusUnauthorized, "attestation refused")
	f.tamper = nil
	if _, err := f.client().Request(context.Background()); err != nil {
		t.Fatalf("bound: %v", err)
	}
}

// A challenge is answered once.
func TestMeshCANonceOnce(t *testing.T) {
	f := newMeshFixture(t)
	ch := f.ca.challengeNonce(t)
	if !f.ca.takeNonce(ch) {
		t.Fatal("a fresh nonce is not outstanding")
	}
	if f.ca.takeNonce(ch) {
		t.Fatal("a nonce was taken twice")
	}
	ch = f.ca.challengeNonce(t)
	f.mu.Lock()
	f.now = f.now.Add(meshNonceTTL + time.Second)
	f.mu.Unlock()
	if f.ca.takeNonce(ch) {
		t.Fatal("an expired nonce was taken")
	}
}

// The owner's policy must give the identity the pod asks for to a
// workload the pod is.
func TestMeshCAIdentityPolicy(t *testing.T) {
	f := newMeshFixture(t)
	f.launch(f.meshDoc("spiffe://c8s.test/ns/default/sa/other"))
	f.refusedWith(t, http.StatusForbidden, `not workload "other" of the identity`)
	f.launch(f.meshDoc("spiffe://c8s.test/ns/kube-system/sa/admin"))
	f.refusedWith(t, http.StatusForbidden, "no [[mesh.identities]] rule gives it")
	// A policy without [mesh] issues nothing.
	f.launch(f.meshDoc(meshID))
	f.setPolicy(t, appPolicy)
	f.refusedWith(t, http.StatusForbidden, "no [mesh] section")
}

// A pod under which the host can run code (no enforced [policy]) gets no
// identity: the host could use its key.
func TestMeshCAUnconfinedRefused(t *testing.T) {
	f := newMeshFixture(t)
	doc := strings.Replace(f.meshDoc(meshID), podInitData, "version = \"0.1\"\n", 1)
	f.launch(doc)
	f.setPolicy(t, strings.Replace(meshPolicy, "$INIT", hex.EncodeToString(digestOf(doc)), 1))
	f.refusedWith(t, http.StatusUnauthorized, "enforced [policy]")
}

// A pod whose rule pins no layers runs the host's binaries under the
// owner's argv, and the host could use the certificate's key: no
// identity, unless the owner's workload accepts the node's root file
// systems (allow_host_rootfs).
func TestMeshCAHostRootfsRefused(t *testing.T) {
	f := newMeshFixture(t)
	doc := strings.Replace(f.meshDoc(meshID), appLayers, "", 1)
	f.launch(doc)
	policy := strings.Replace(meshPolicy, "$INIT", hex.EncodeToString(digestOf(doc)), 1)
	f.setPolicy(t, policy)
	f.refusedWith(t, http.StatusUnauthorized, `rule "app" does not pin its image's layers`)
	f.setPolicy(t, strings.Replace(policy, "[workloads.app]\n", "[workloads.app]\nallow_host_rootfs = true\n", 1))
	if _, err := f.client().Request(context.Background()); err != nil {
		t.Fatalf("the workload accepts the node's root file systems: %v", err)
	}
}

func digestOf(doc string) []byte {
	d := initdata.Digest([]byte(doc))
	return d[:]
}

// An expired certificate is replaced by a fresh attestation: a new key,
// a new certificate valid from now.
func TestMeshCARenewsExpired(t *testing.T) {
	f := newMeshFixture(t)
	f.ca.Now = nil // the pod checks validity by its own clock: real time here
	f.ca.Lifetime = 2 * time.Second
	first, err := f.client().Request(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(first.TLS.Leaf.NotAfter) + time.Second)
	if time.Now().Before(first.TLS.Leaf.NotAfter) {
		t.Fatal("the first certificate has not expired")
	}
	second, err := f.client().Request(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !second.TLS.Leaf.NotAfter.After(time.Now()) || second.TLS.Leaf.SerialNumber.Cmp(first.TLS.Leaf.SerialNumber) == 0 {
		t.Fatal("the renewal is not a new certificate valid from now")
	}
	if bytes.Equal(first.KeyPEM, second.KeyPEM) {
		t.Fatal("the renewal reused the key")
	}
	// Withdrawn from the policy: the renewal is refused.
	f.ca.SetBroker(&Broker{Verifier: f.broker.Verifier, Policy: f.broker.Policy,
		ResourcePolicy: mustPolicy(t, f.expand(strings.Replace(meshPolicy, `workloads = ["app"]`, `workloads = ["other"]`, 1)))})
	f.refusedWith(t, http.StatusForbidden, "mesh identity "+meshID)
}

func mustPolicy(t *testing.T, doc string) *ResourcePolicy {
	t.Helper()
	p, err := ParseResourcePolicy([]byte(doc), false, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMeshPolicyRefusedWhenMalformed(t *testing.T) {
	for name, tc := range map[string]struct{ from, to, want string }{
		"no trust domain":  {`trust_domain = "c8s.test"`, ``, "mesh.trust_domain is required"},
		"bad name":         {`service_account = "app"`, `service_account = "App"`, "mesh.identities[0]"},
		"unknown workload": {`workloads = ["app"]`, `workloads = ["nobody"]`, `workload "nobody" is not defined`},
		"no workloads":     {`workloads = ["app"]`, `workloads = []`, "no workloads"},
		"defined twice":    {`service_account = "other"`, `service_account = "app"`, "defined twice"},
		"misspelt key":     {`service_account = "app"`, `serviceaccount = "app"`, "serviceaccount"},
	} {
		t.Run(name, func(t *testing.T) {
			doc := strings.Replace(meshPolicy, tc.from, tc.to, 1)
			doc = strings.NewReplacer("$INIT", strings.Repeat("ab", 32), "$MEAS", strings.Repeat("cd", 48), "$OTHER", strings.Repeat("ef", 32)).Replace(doc)
			if _, err := ParseResourcePolicy([]byte(doc), false, t.TempDir()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// challengeNonce asks the CA for a nonce in-process.
func (ca *MeshCA) challengeNonce(t *testing.T) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	ca.challenge(rec, httptest.NewRequest(http.MethodPost, meshapi.ChallengePath, nil))
	var ch meshapi.Challenge
	if err := json.Unmarshal(rec.Body.Bytes(), &ch); err != nil || len(ch.Nonce) != meshapi.NonceSize {
		t.Fatalf("challenge: %s %v", rec.Body.String(), err)
	}
	return ch.Nonce
}
