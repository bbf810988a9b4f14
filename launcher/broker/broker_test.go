package broker

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/google/go-sev-guest/kds"
	"github.com/sirupsen/logrus"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	guestkbs "github.com/c8s-dev/c8s/guest/kbs"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

const secret = "s3cr3t-db-password-9f1c"

var shared struct {
	once sync.Once
	sp   *sim.SP
	err  error
}

// simSP returns a simulated secure processor shared by the tests (making
// one costs two RSA-4096 keys).
func simSP(t testing.TB) *sim.SP {
	t.Helper()
	shared.once.Do(func() { shared.sp, shared.err = sim.New(kds.TCBParts{BlSpl: 3, SnpSpl: 20, UcodeSpl: 200}) })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.sp
}

// fixture is a broker over real TLS and a pod whose evidence the sim SP
// signs.
type fixture struct {
	srv         *httptest.Server
	roots       *x509.CertPool
	broker      *Broker
	sp          *sim.SP
	measurement [48]byte // what the pod's reports carry
	guestPolicy uint64   // the SNP guest policy its reports carry (0: sim's default)
	initData    []byte
	evidence    atomic.Int32 // evidence requests
	logger      *logrus.Logger
	logs        *logBuffer // what the broker logged
	certPEM     []byte     // the broker's certificate, which the init data pins
}

// logBuffer collects log lines written from the server's goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// podInitData is init data under an enforced [policy]: the host creates
// only container app, as its rule says, from the image layer it pins, and
// execs nothing. fixture.doc adds the [kbs] section naming the fixture's
// broker and the resources.
const podInitData = `version = "0.1"
[policy]
[policy.containers.app]
image = "registry.example/app:1"
args = ["/app"]
working_dir = "/"
uid = 1000
gid = 1000
` + appLayers

// appLayers pins the app's image: its one layer, by diff ID and dm-verity
// root.
const appLayers = `layers = [{ digest = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef", verity = "9c3a0f6e4bd1c2a3e4f5061728394a5b6c7d8e9f00112233445566778899aabb", blocks = 1187 }]
`

// hostRootfsInitData is podInitData without the layers: the host supplies
// the app's root file system, so /app is whatever it puts there.
var hostRootfsInitData = strings.Replace(podInitData, appLayers, "", 1)

// dbPassword is the resource the fixture's pod asks for.
const dbPassword = "default/key/db-password"

// kbsSection is a [kbs] section naming the fixture's broker, as a pod's
// init data names it (its URL and live certificate), with a secret for
// each resource.
func (f *fixture) kbsSection(resources ...string) string {
	s := fmt.Sprintf("\n[kbs]\nurl = %q\ncert = \"\"\"\n%s\"\"\"\n", f.srv.URL, f.certPEM)
	for i, r := range resources {
		s += fmt.Sprintf("[[kbs.secrets]]\nresource = \"kbs:///%s\"\npath = \"/run/secrets/s%d\"\n", r, i)
	}
	return s
}

// doc is body with a [kbs] section asking the fixture's broker for
// resources (default: dbPassword).
func (f *fixture) doc(body string, resources ...string) string {
	if len(resources) == 0 {
		resources = []string{dbPassword}
	}
	return body + f.kbsSection(resources...)
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	sp := simSP(t)
	f := &fixture{sp: sp}
	if _, err := rand.Read(f.measurement[:]); err != nil {
		t.Fatal(err)
	}
	v, err := attest.NewVerifier(attest.Trust{Mode: attest.ModeSim, SimCertChain: sp.CertChainPEM()})
	if err != nil {
		t.Fatal(err)
	}
	m := f.measurement
	f.broker = &Broker{
		Verifier:  v,
		Policy:    attest.Policy{Measurements: map[int]attest.Hex{1: m[:]}, VCPUs: 1},
		Resources: Map{dbPassword: []byte(secret)},
	}
	f.logs = &logBuffer{}
	f.logger = logrus.New()
	f.logger.SetOutput(f.logs)
	f.srv, f.roots, f.certPEM = tlsServerLogging(t, f.broker, log.WithLogger(context.Background(), logrus.NewEntry(f.logger)))
	f.launch(f.doc(podInitData)) // the owner's pod
	return f
}

// tlsServer serves h over TLS with a fresh self-signed certificate and
// returns the pool that pins it.
func tlsServer(t testing.TB, h http.Handler) (*httptest.Server, *x509.CertPool) {
	srv, pool, _ := tlsServerLogging(t, h, context.Background())
	return srv, pool
}

// tlsServerLogging is tlsServer with requests whose contexts derive from
// ctx (and log to its logger), and also returns the certificate.
func tlsServerLogging(t testing.TB, h http.Handler, ctx context.Context) (*httptest.Server, *x509.CertPool, []byte) {
	t.Helper()
	certPEM, keyPEM, err := SelfSigned([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.BaseContext = func(net.Listener) context.Context { return ctx }
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(certPEM) {
		t.Fatal("pin the broker certificate")
	}
	return srv, pool, certPEM
}

// launch makes doc the init data the pod is launched with, sends and the
// broker pins.
func (f *fixture) launch(doc string) {
	f.initData = []byte(doc)
	f.broker.InitData = [][]byte{f.initData}
}

// snpEvidence is the pod's evidence source.
func (f *fixture) snpEvidence(_ context.Context, rd [64]byte) (string, []byte, error) {
	f.evidence.Add(1)
	req := sim.Request{Measurement: f.measurement, HostData: initdata.Digest(f.initData), ReportData: rd, Policy: f.guestPolicy}
	report, err := f.sp.Report(req)
	if err != nil {
		return "", nil, err
	}
	e, err := kbsapi.NewSNPEvidence(report, f.sp.CertTable())
	if err != nil {
		return "", nil, err
	}
	ev, err := json.Marshal(e)
	return kbsapi.TeeSNP, ev, err
}

func (f *fixture) client() *guestkbs.Client {
	return &guestkbs.Client{URL: f.srv.URL, Roots: f.roots, Evidence: f.snpEvidence, Tee: kbsapi.TeeSNP, InitData: f.initData}
}

func TestFetch(t *testing.T) {
	f := newFixture(t)
	got, err := f.client().Fetch(context.Background(), []string{"default/key/db-password"})
	if err != nil {
		t.Fatal(err)
	}
	if string(got[0]) != secret {
		t.Fatalf("got %q, want the stored secret", got[0])
	}
	// Each decision is logged through the request's context, the
	// secret never.
	logs := f.logs.String()
	if !strings.Contains(logs, "kbs: attested") || !strings.Contains(logs, "kbs: released default/key/db-password") || strings.Contains(logs, secret) {
		t.Fatalf("broker log %q: want the attestation and the release, without the secret", logs)
	}
}

func TestAlteredMeasurementRefused(t *testing.T) {
	f := newFixture(t)
	f.measurement[0] ^= 1 // the pod booted something else than the policy's image
	c := f.client()
	_, err := c.FetchRetry(context.Background(), []string{"default/key/db-password"}, guestkbs.Retry{Attempts: 3, Backoff: time.Millisecond})
	var e *guestkbs.Error
	if !errors.As(err, &e) || e.Status != http.StatusUnauthorized || e.Op != "attest" {
		t.Fatalf("err = %v, want a 401 on attest", err)
	}
	if !strings.Contains(err.Error(), "measurement mismatch") || strings.Contains(err.Error(), secret) {
		t.Fatalf("err = %v: want the mismatch named and no secret", err)
	}
	if n := f.evidence.Load(); n != 1 {
		t.Fatalf("a refusal was retried: %d evidence requests", n)
	}
}

// The evidence's HOST_DATA must be the digest of the document sent with
// it, even when the owner pinned both documents.
func TestHostDataMustMatchInitData(t *testing.T) {
	f := newFixture(t)
	other := append(slices.Clone(f.initData), '\n') // not what HOST_DATA holds
	f.broker.InitData = append(f.broker.InitData, other)
	c := f.client()
	c.InitData = other
	_, err := c.Fetch(context.Background(), []string{"default/key/db-password"})
	if err == nil || !strings.Contains(err.Error(), "HOST_DATA mismatch") {
		t.Fatalf("err = %v, want a HOST_DATA mismatch", err)
	}
}

// The host launches the pod, so it chooses the init data: only documents
// the owner pinned (InitData, or Policy.HostData) are accepted.
func TestInitDataMustBePinned(t *testing.T) {
	f := newFixture(t)
	// The host's own document, with a [policy] of its liking, sent with
	// evidence that shows its digest.
	hostDoc := strings.Replace(string(f.initData), `args = ["/app"]`, `args = ["re:.*"]`, 1)
	f.initData = []byte(hostDoc)
	c := f.client()
	_, err := c.Fetch(context.Background(), []string{"default/key/db-password"})
	sum := initdata.Digest([]byte(hostDoc))
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("init-data sent (HOST_DATA %x) is not a document the broker pins", sum)) || !strings.Contains(err.Error(), "--init-data FILE") {
		t.Fatalf("err = %v, want the unpinned document refused, naming its digest and the flag", err)
	}
	// Nothing pinned: refused, unless AnyInitData.
	f.broker.InitData = nil
	if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err == nil || !strings.Contains(err.Error(), "pins no init data") {
		t.Fatalf("nothing pinned: err = %v", err)
	}
	f.broker.AnyInitData = true
	if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err != nil {
		t.Fatalf("with AnyInitData: %v", err)
	}
	// The digest pinned as the policy's host_data.
	f.broker.AnyInitData = false
	f.broker.Policy.HostData = sum[:]
	if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err != nil {
		t.Fatalf("pinned by Policy.HostData: %v", err)
	}
}

// Without a [policy] the host creates a container of its own, which gets
// the pod's secrets, and reads its output, whatever allow_exec says; in
// audit mode the policy only logs. Such pods get nothing, unless
// AllowUnconfinedHost.
func TestUnconfinedHostRefused(t *testing.T) {
	for name, tc := range map[string]struct {
		doc  string
		want []string
	}{
		"no policy, allow_exec = false": {"version = \"0.1\"\n[agent_policy]\nallow_exec = false\n", []string{"no [policy] section", "whatever agent_policy.allow_exec says", "add a [policy] section (c8s-measure policy can generate one)"}},
		"no policy, exec allowed":       {"version = \"0.1\"\n", []string{"no [policy] section", "add a [policy] section"}},
		"policy in audit mode":          {strings.Replace(podInitData, "[policy]\n", "[policy]\naudit = true\n", 1), []string{"audit mode", "set policy.audit = false"}},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.launch(f.doc(tc.doc))
			c := f.client()
			_, err := c.Fetch(context.Background(), []string{"default/key/db-password"})
			var e *guestkbs.Error
			if !errors.As(err, &e) || e.Status != http.StatusUnauthorized {
				t.Fatalf("err = %v, want a 401", err)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %v: does not say %q", err, want)
				}
			}
			f.broker.AllowUnconfinedHost = true
			if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err != nil {
				t.Fatalf("with AllowUnconfinedHost: %v", err)
			}
		})
	}
}

// A measured [policy] governs exec per container: the owner's exec lists
// are the owner's choice, but a policy in audit mode only logs denials,
// so the host could exec anything and read the secrets back.
func TestPolicyExecRules(t *testing.T) {
	for name, tc := range map[string]struct {
		doc  string
		want string // "" = released
	}{
		"enforced, no exec":   {podInitData, ""},
		"enforced, exec list": {podInitData + "exec = [[\"/app\", \"health\"]]\n", ""},
		"audit mode":          {strings.Replace(podInitData, "[policy]\n", "[policy]\naudit = true\n", 1), "audit mode"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.launch(f.doc(tc.doc))
			_, err := f.client().Fetch(context.Background(), []string{"default/key/db-password"})
			if tc.want == "" && err != nil {
				t.Fatalf("released to an enforced policy: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("err = %v, want a refusal naming %q", err, tc.want)
			}
		})
	}
}

// An attestation without init-data: the broker cannot see the pod's
// policy, so it is refused; under AllowUnconfinedHost the evidence's
// HOST_DATA must still be the one pinned digest, and no resource is
// released: the broker cannot see which ones the pod's document names.
func TestNoInitDataSent(t *testing.T) {
	f := newFixture(t)
	c := f.client()
	c.InitData = nil
	_, err := c.Fetch(context.Background(), []string{"default/key/db-password"})
	if err == nil || !strings.Contains(err.Error(), "carries no init-data") {
		t.Fatalf("err = %v, want the missing init-data refused", err)
	}
	f.broker.AllowUnconfinedHost = true
	var e *guestkbs.Error
	_, err = c.Fetch(context.Background(), []string{"default/key/db-password"})
	if !errors.As(err, &e) || e.Op != "resource default/key/db-password" || e.Status != http.StatusForbidden || !strings.Contains(err.Error(), "carried no init data") {
		t.Fatalf("with AllowUnconfinedHost, the launched document pinned: err = %v, want attested, then the resource refused (403)", err)
	}
	f.broker.InitData = [][]byte{append(slices.Clone(f.initData), '\n')}
	if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err == nil || !strings.Contains(err.Error(), "HOST_DATA mismatch") {
		t.Fatalf("another document pinned: err = %v", err)
	}
	f.broker.InitData = append(f.broker.InitData, f.initData)
	if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err == nil || !strings.Contains(err.Error(), "pins 2 documents") {
		t.Fatalf("two documents pinned: err = %v", err)
	}
	f.broker.InitData = nil
	if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err == nil || !strings.Contains(err.Error(), "pins no HOST_DATA") {
		t.Fatalf("nothing pinned: err = %v", err)
	}
}

func TestWrongBrokerCertRefused(t *testing.T) {
	f := newFixture(t)
	_, otherRoots := tlsServer(t, http.NotFoundHandler())
	c := f.client()
	c.Roots = otherRoots
	_, err := c.FetchRetry(context.Background(), []string{"default/key/db-password"}, guestkbs.Retry{Attempts: 3, Backoff: time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("err = %v, want a certificate error", err)
	}
	if n := f.evidence.Load(); n != 0 {
		t.Fatalf("evidence was produced for an unauthenticated broker (%d times)", n)
	}
}

func TestMissingResource(t *testing.T) {
	f := newFixture(t)
	f.launch(f.doc(podInitData, dbPassword, "default/key/nope"))
	_, err := f.client().Fetch(context.Background(), []string{"default/key/nope"})
	var e *guestkbs.Error
	if !errors.As(err, &e) || e.Status != http.StatusNotFound || !strings.Contains(err.Error(), "default/key/nope") {
		t.Fatalf("err = %v, want a 404 naming the resource", err)
	}
}

func TestUnreachableBrokerRetried(t *testing.T) {
	f := newFixture(t)
	c := f.client()
	f.srv.Close()
	var logged int
	_, err := c.FetchRetry(context.Background(), []string{"default/key/db-password"}, guestkbs.Retry{
		Attempts: 3, Backoff: time.Millisecond, Log: func(int, error, time.Duration) { logged++ }})
	if err == nil || !strings.Contains(err.Error(), "after 3 attempts") || logged != 2 {
		t.Fatalf("err = %v, %d retries logged; want 3 attempts", err, logged)
	}
}

// rawSession speaks the protocol by hand, to replay messages.
type rawSession struct {
	t    *testing.T
	f    *fixture
	http *http.Client
}

func (f *fixture) rawSession(t *testing.T) *rawSession {
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.roots}}}
	return &rawSession{t: t, f: f, http: c}
}

func (s *rawSession) post(path string, v any) (int, []byte) {
	s.t.Helper()
	b, _ := json.Marshal(v)
	resp, err := s.http.Post(s.f.srv.URL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

func (s *rawSession) auth() kbsapi.Challenge {
	s.t.Helper()
	st, body := s.post(kbsapi.AuthPath, kbsapi.Request{Version: kbsapi.ProtocolVersion, Tee: kbsapi.TeeSNP, ExtraParams: map[string]any{}})
	var ch kbsapi.Challenge
	if st != http.StatusOK || json.Unmarshal(body, &ch) != nil {
		s.t.Fatalf("auth: %d %s", st, body)
	}
	return ch
}

// attestation answers ch.
func (s *rawSession) attestation(ch kbsapi.Challenge) kbsapi.Attestation {
	s.t.Helper()
	rt := kbsapi.RuntimeData{Nonce: ch.Nonce, TeePubKey: json.RawMessage(`{"kty":"EC","crv":"P-256","alg":"ECDH-ES+A256KW","x":"weNJy2HscCSM6AEDTDg04biOvhFhyyWvOHQfeF_PxMQ","y":"e8lnCO-AlStT-NJVX-crhB7QRYhiix03illJOVAOyck"}`)}
	bound, err := kbsapi.PrimaryRuntimeData(rt, "")
	if err != nil {
		s.t.Fatal(err)
	}
	rd, err := kbsapi.ReportData(bound, kbsapi.DefaultHashAlgorithm)
	if err != nil {
		s.t.Fatal(err)
	}
	_, ev, err := s.f.snpEvidence(context.Background(), rd)
	if err != nil {
		s.t.Fatal(err)
	}
	return kbsapi.Attestation{RuntimeData: rt, TeeEvidence: kbsapi.CompositeEvidence{PrimaryEvidence: ev}, InitData: &kbsapi.InitData{Format: "toml", Body: string(s.f.initData)}}
}

func TestReplayedAttestationRefused(t *testing.T) {
	f := newFixture(t)
	a := f.rawSession(t)
	att := a.attestation(a.auth())
	if st, body := a.post(kbsapi.AttestPath, att); st != http.StatusOK {
		t.Fatalf("first attestation: %d %s", st, body)
	}
	// The same message again on the same session: the challenge is spent.
	if st, body := a.post(kbsapi.AttestPath, att); st != http.StatusUnauthorized || !strings.Contains(string(body), "already answered") {
		t.Fatalf("replay on the same session: %d %s", st, body)
	}
	// The old message on a fresh session: its nonce is not the new one.
	b := f.rawSession(t)
	b.auth()
	if st, body := b.post(kbsapi.AttestPath, att); st != http.StatusUnauthorized || !strings.Contains(string(body), "nonce") {
		t.Fatalf("replay on a new session: %d %s", st, body)
	}
	if logs := f.logs.String(); !strings.Contains(logs, "refused a second attestation") || !strings.Contains(logs, "attestation refused") {
		t.Fatalf("broker log %q: want both refusals", logs)
	}
	// That session never attested: nothing is released to it.
	resp, err := b.http.Get(f.srv.URL + kbsapi.ResourcePath + "default/key/db-password")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(body), secret) {
		t.Fatalf("resource for an unattested session: %d %s", resp.StatusCode, body)
	}
}

func TestDirResources(t *testing.T) {
	d := Dir(t.TempDir())
	for _, p := range []string{"../x/y", "a/b", "/a/b/c", "a/../b/c"} {
		if _, err := d.Get(p); err == nil {
			t.Errorf("Get(%q) succeeded", p)
		}
	}
}

func TestFetchThroughRelay(t *testing.T) {
	f := newFixture(t)
	guestEnd, hostEnd := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Relay(ctx, hostEnd, f.srv.Listener.Addr().String()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	opened := 0
	d := &guestkbs.PortDialer{Open: func() (net.Conn, error) { opened++; return guestEnd, nil }}
	c := f.client()
	c.URL = "https://127.0.0.1:1" // the relay, not the URL, decides where bytes go
	c.Dial = d.DialContext
	for range 2 {
		got, err := c.Fetch(context.Background(), []string{"default/key/db-password"})
		if err != nil {
			t.Fatal(err)
		}
		if string(got[0]) != secret {
			t.Fatalf("got %q through the relay", got[0])
		}
	}
	if opened != 1 {
		t.Fatalf("the port was opened %d times; one session carries every stream", opened)
	}
}

func TestOldTCBRefused(t *testing.T) {
	f := newFixture(t)
	tcb := f.sp.TCB()
	tcb.SnpSpl++ // the policy wants newer firmware than the chip reports
	min, err := kds.ComposeTCBParts(tcb)
	if err != nil {
		t.Fatal(err)
	}
	f.broker.Policy.MinTCB = uint64(min)
	_, err = f.client().Fetch(context.Background(), []string{"default/key/db-password"})
	var e *guestkbs.Error
	if !errors.As(err, &e) || e.Status != http.StatusUnauthorized || !strings.Contains(err.Error(), "TCB") {
		t.Fatalf("err = %v, want a 401 naming the TCB", err)
	}
}

func BenchmarkFetchThroughRelay(b *testing.B) {
	f := newFixture(b)
	guestEnd, hostEnd := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Relay(ctx, hostEnd, f.srv.Listener.Addr().String())
	f.logger.SetOutput(io.Discard)
	d := &guestkbs.PortDialer{Open: func() (net.Conn, error) { return guestEnd, nil }}
	c := f.client()
	c.Dial = d.DialContext
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err != nil {
			b.Fatal(err)
		}
	}
}
