package broker

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
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
	initData    []byte
	evidence    atomic.Int32 // evidence requests
	logger      *logrus.Logger
	logs        *logBuffer // what the broker logged
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

func newFixture(t testing.TB) *fixture {
	t.Helper()
	sp := simSP(t)
	f := &fixture{sp: sp, initData: []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")}
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
		Resources: Map{"default/key/db-password": []byte(secret)},
	}
	f.logs = &logBuffer{}
	f.logger = logrus.New()
	f.logger.SetOutput(f.logs)
	f.srv, f.roots = tlsServerLogging(t, f.broker, log.WithLogger(context.Background(), logrus.NewEntry(f.logger)))
	return f
}

// tlsServer serves h over TLS with a fresh self-signed certificate and
// returns the pool that pins it.
func tlsServer(t testing.TB, h http.Handler) (*httptest.Server, *x509.CertPool) {
	return tlsServerLogging(t, h, context.Background())
}

// tlsServerLogging is tlsServer with requests whose contexts derive from
// ctx (and log to its logger).
func tlsServerLogging(t testing.TB, h http.Handler, ctx context.Context) (*httptest.Server, *x509.CertPool) {
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
	return srv, pool
}

// snpEvidence is the pod's evidence source.
func (f *fixture) snpEvidence(_ context.Context, rd [64]byte) (string, []byte, error) {
	f.evidence.Add(1)
	req := sim.Request{Measurement: f.measurement, HostData: initdata.Digest(f.initData), ReportData: rd}
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

func TestHostDataMustMatchInitData(t *testing.T) {
	f := newFixture(t)
	c := f.client()
	c.InitData = []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n\n") // not what HOST_DATA holds
	_, err := c.Fetch(context.Background(), []string{"default/key/db-password"})
	if err == nil || !strings.Contains(err.Error(), "HOST_DATA") {
		t.Fatalf("err = %v, want a HOST_DATA mismatch", err)
	}
}

func TestExecAllowedPodRefused(t *testing.T) {
	f := newFixture(t)
	f.initData = []byte("version = \"0.1\"\n") // exec allowed by default
	c := f.client()
	c.InitData = f.initData
	_, err := c.Fetch(context.Background(), []string{"default/key/db-password"})
	if err == nil || !strings.Contains(err.Error(), "allow_exec") {
		t.Fatalf("err = %v, want a refusal naming allow_exec", err)
	}
	f.broker.AllowExec = true
	if _, err := c.Fetch(context.Background(), []string{"default/key/db-password"}); err != nil {
		t.Fatalf("with AllowExec: %v", err)
	}
}

// A measured [policy] governs exec per container: the owner's exec lists
// are the owner's choice, but a policy in audit mode only logs denials,
// so the host could exec anything and read the secrets back.
func TestPolicyExecRules(t *testing.T) {
	const rule = "[policy.containers.app]\nimage = \"registry.example/app:1\"\nargs = [\"/app\"]\n"
	for name, tc := range map[string]struct {
		doc  string
		want string // "" = released
	}{
		"enforced, no exec":   {"version = \"0.1\"\n[policy]\n" + rule, ""},
		"enforced, exec list": {"version = \"0.1\"\n[policy]\n" + rule + "exec = [[\"/app\", \"health\"]]\n", ""},
		"audit mode":          {"version = \"0.1\"\n[policy]\naudit = true\n" + rule, "audit mode"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.initData = []byte(tc.doc)
			c := f.client()
			c.InitData = f.initData
			_, err := c.Fetch(context.Background(), []string{"default/key/db-password"})
			if tc.want == "" && err != nil {
				t.Fatalf("released to an enforced policy: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("err = %v, want a refusal naming %q", err, tc.want)
			}
		})
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
