package mesh

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
)

// fakeClock is a Clock the test moves by hand.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
	waiting chan time.Duration // each After, with its duration
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Now(), waiting: make(chan time.Duration, 16)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, waiter{c.now.Add(d), ch})
	c.mu.Unlock()
	c.waiting <- d
	return ch
}

// advance moves the clock and fires the waiters due.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	var left []waiter
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			left = append(left, w)
		}
	}
	c.waiters = left
}

// nextWait returns the duration of the Renewer's next wait.
func (c *fakeClock) nextWait(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.waiting:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the renewer did not wait")
		return 0
	}
}

// renewFixture runs a Renewer whose requests answer from answers, in
// order, installing into a Store and a Proxy.
type renewFixture struct {
	clock   *fakeClock
	r       *Renewer
	store   *Store
	proxy   *Proxy
	mu      sync.Mutex
	answers []func() (*Certificate, error)
	asked   int
}

func newRenewFixture(t *testing.T, clock *fakeClock, answers ...func() (*Certificate, error)) *renewFixture {
	f := &renewFixture{clock: clock, answers: answers, store: &Store{Dir: filepath.Join(t.TempDir(), "mesh")}, proxy: &Proxy{}}
	f.r = &Renewer{
		Clock: f.clock,
		Retry: 5 * time.Second,
		Request: func(context.Context) (*Certificate, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			a := f.answers[f.asked]
			f.asked++
			return a()
		},
		Install: func(c *Certificate) error {
			if err := f.store.Write(c); err != nil {
				return err
			}
			f.proxy.SetCertificate(c)
			return nil
		},
		Drop: func(error) {
			f.proxy.SetCertificate(nil)
			f.store.Remove()
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// certFile is what cert.pem holds ("": no file).
func (f *renewFixture) certFile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.store.Dir, meshapi.CertFile))
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// approx reports whether d is within a second of want (the certificate's
// NotAfter is set from the real clock when it is issued).
func approx(d, want time.Duration) bool {
	return d > want-time.Second && d < want+time.Second
}

// The certificate is renewed at two thirds of its life; a refusal at
// renewal takes it away (files gone, proxy without it).
func TestRenewerRenewsAndDropsOnRefusal(t *testing.T) {
	ca := newTestCA(t)
	clock := newFakeClock()
	// Valid for 90s from the fake clock's now when issued.
	var first, second *Certificate
	f := newRenewFixture(t, clock,
		func() (*Certificate, error) {
			first = ca.issue(t, idServer, time.Until(clock.Now())+90*time.Second)
			return first, nil
		},
		func() (*Certificate, error) {
			second = ca.issue(t, idServer, time.Until(clock.Now())+90*time.Second)
			return second, nil
		},
		func() (*Certificate, error) {
			return nil, &Refused{Status: 401, Detail: "attestation refused"}
		},
	)
	<-f.r.FirstAttempt()
	if d := f.clock.nextWait(t); !approx(d, 60*time.Second) {
		t.Fatalf("first renewal in %v, want 2/3 of 90s", d)
	}
	if f.r.Current() != first || f.certFile(t) != string(first.CertPEM) || f.proxy.cert.Load() != first {
		t.Fatal("the first certificate is not installed")
	}
	f.clock.advance(60 * time.Second)
	if d := f.clock.nextWait(t); !approx(d, 60*time.Second) {
		t.Fatalf("second renewal in %v", d)
	}
	if f.r.Current() != second || f.certFile(t) != string(second.CertPEM) {
		t.Fatal("the renewed certificate is not installed")
	}
	f.clock.advance(60 * time.Second)
	if d := f.clock.nextWait(t); d != 50*time.Second {
		t.Fatalf("after a refusal the renewer waits %v, want 10 × Retry", d)
	}
	if f.r.Current() != nil || f.certFile(t) != "" || f.proxy.cert.Load() != nil {
		t.Fatal("a refused pod kept its certificate")
	}
	if _, err := os.Lstat(filepath.Join(f.store.Dir, meshapi.KeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the key is still there: %v", err)
	}
}

// An unreachable CA is retried; the certificate is kept until it expires,
// then dropped.
func TestRenewerKeepsCertificateUntilExpiry(t *testing.T) {
	ca := newTestCA(t)
	cert := ca.issue(t, idServer, 30*time.Second)
	down := errors.New("connection refused")
	f := newRenewFixture(t, newFakeClock(),
		func() (*Certificate, error) { return cert, nil },
		func() (*Certificate, error) { return nil, down },
		func() (*Certificate, error) { return nil, down },
		func() (*Certificate, error) { return nil, down },
		func() (*Certificate, error) { return nil, down },
	)
	if d := f.clock.nextWait(t); !approx(d, 20*time.Second) {
		t.Fatalf("renewal in %v, want 20s", d)
	}
	f.clock.advance(20 * time.Second) // ~10s left
	if d := f.clock.nextWait(t); d != 5*time.Second {
		t.Fatalf("retry in %v, want Retry", d)
	}
	if f.r.Current() != cert || f.certFile(t) == "" {
		t.Fatal("a transient failure dropped a valid certificate")
	}
	f.clock.advance(5 * time.Second) // ~5s left
	if d := f.clock.nextWait(t); d > 5*time.Second {
		t.Fatalf("retry in %v, want no later than the expiry", d)
	}
	f.clock.advance(5 * time.Second) // expired
	f.clock.nextWait(t)
	if f.r.Current() != nil || f.certFile(t) != "" || f.proxy.cert.Load() != nil {
		t.Fatal("an expired certificate was kept")
	}
}

// The pod gets its identity back when the CA issues again.
func TestRenewerRecovers(t *testing.T) {
	ca := newTestCA(t)
	cert := ca.issue(t, idServer, time.Hour)
	f := newRenewFixture(t, newFakeClock(),
		func() (*Certificate, error) { return nil, &Refused{Status: 403} },
		func() (*Certificate, error) { return cert, nil },
	)
	<-f.r.FirstAttempt()
	if f.r.Current() != nil {
		t.Fatal("a refused pod has a certificate")
	}
	f.clock.advance(f.clock.nextWait(t))
	f.clock.nextWait(t)
	if f.r.Current() != cert || f.certFile(t) != string(cert.CertPEM) {
		t.Fatal("the certificate issued later is not installed")
	}
}

// TestMaliciousHostInterceptsRenewal: the host answers the pod's renewal
// connection to the mesh CA with a certificate of its own. The client
// refuses it (the endpoint is pinned), and that is no refusal by the CA:
// the pod keeps its certificate until it expires, as when the CA is
// unreachable. Before, it was dropped at once, and again at every renewal.
func TestMaliciousHostInterceptsRenewal(t *testing.T) {
	ca := newTestCA(t)
	intercept := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer intercept.Close()
	pinned := x509.NewCertPool()
	pinned.AddCert(newTestCA(t).cert) // the CA endpoint's certificate, not the host's
	client := &Client{URL: intercept.URL, Roots: pinned, CA: ca.pool, Identity: idClient,
		Evidence: func(context.Context, [64]byte) (string, []byte, error) { return "sim", nil, nil }}
	var calls atomic.Int32
	var dropped atomic.Pointer[error]
	var lastErr atomic.Pointer[error]
	clock := newFakeClock()
	r := &Renewer{
		Clock: clock,
		Request: func(ctx context.Context) (*Certificate, error) {
			if calls.Add(1) == 1 {
				return ca.issue(t, idClient, time.Hour), nil
			}
			_, err := client.Request(ctx)
			lastErr.Store(&err)
			return nil, err
		},
		Install: func(*Certificate) error { return nil },
		Drop:    func(why error) { dropped.Store(&why) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	clock.advance(clock.nextWait(t)) // the renewal, at 2/3 of the hour
	if wait := clock.nextWait(t); wait > DefaultRetry {
		t.Errorf("after an intercepted renewal the next try is in %v, want within %v", wait, DefaultRetry)
	}
	if e := lastErr.Load(); e == nil || !strings.Contains((*e).Error(), "certificate") {
		t.Fatalf("the renewal was not refused by the client's pin: %v", e)
	}
	if e := dropped.Load(); e != nil {
		t.Fatalf("the certificate (20m left) was dropped on an intercepted renewal: %v", *e)
	}
	if r.Current() == nil {
		t.Fatal("no current certificate after an intercepted renewal")
	}
}
