package broker

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
)

// A source fills only its own share of the table: past it, its own
// oldest challenge goes. A full table drops the oldest of the source that
// holds the most, never a proven entry; full of proven entries, it
// refuses.
func TestChallengesFairShare(t *testing.T) {
	now := time.Now()
	later := now.Add(time.Hour)
	tb := newChallenges[int](6, 3)
	at := func(i int) time.Time { return now.Add(time.Duration(i) * time.Millisecond) }
	for i := range 5 {
		if !tb.add(at(i), fmt.Sprint("flood", i), "10.0.0.66", later, i) {
			t.Fatalf("add %d refused", i)
		}
	}
	if n := tb.unproven("10.0.0.66"); n != 3 {
		t.Fatalf("the flooding source holds %d, want its share of 3", n)
	}
	if _, ok := tb.get(at(5), "flood0"); ok {
		t.Fatal("the flooder's oldest challenge stayed past its share")
	}
	for i, src := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		tb.add(at(10+i), "pod"+src, src, later, i)
	}
	// Full (3 + 3): the next goes in place of the flooder's oldest.
	if !tb.add(at(20), "pod4", "10.0.0.4", later, 4) {
		t.Fatal("a full table refused a new source")
	}
	for _, id := range []string{"pod10.0.0.1", "pod10.0.0.2", "pod10.0.0.3", "pod4", "flood4"} {
		if _, ok := tb.get(at(21), id); !ok {
			t.Errorf("%s was dropped, want the flooder's oldest", id)
		}
	}
	if _, ok := tb.get(at(21), "flood2"); ok {
		t.Error("the flooder's oldest stayed in a full table")
	}
	// Proven entries are never dropped; a table of them refuses.
	tb = newChallenges[int](2, 2)
	tb.add(now, "a", "x", later, 0)
	tb.add(now, "b", "y", later, 0)
	tb.prove("a")
	tb.prove("b")
	if tb.add(now, "c", "z", later, 0) {
		t.Fatal("a table full of proven entries took another")
	}
	// Expired entries make room, and take removes.
	if !tb.add(later.Add(time.Second), "c", "z", later.Add(time.Hour), 0) {
		t.Fatal("expired entries did not make room")
	}
	if _, ok := tb.take(later, "c"); !ok {
		t.Fatal("take of a live entry")
	}
	if _, ok := tb.get(later, "c"); ok {
		t.Fatal("take left the entry")
	}
}

// TestMaliciousHostFloodsTheMeshCA: one node asks the mesh CA for
// challenges without end. Before, 4096 outstanding nonces refused every
// other node's pods their renewals for two minutes at a time; now the
// node fills only its own share, and a pod elsewhere still gets a nonce
// that the CA honours.
func TestMaliciousHostFloodsTheMeshCA(t *testing.T) {
	ca := NewMeshCA(&Broker{}, nil, nil)
	ask := func(from string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, meshapi.ChallengePath, nil)
		r.RemoteAddr = from
		w := httptest.NewRecorder()
		ca.ServeHTTP(w, r)
		return w
	}
	for range maxMeshNonces + 100 {
		ask("192.0.2.66:40000")
	}
	w := ask("192.0.2.7:41000")
	if w.Code != http.StatusOK {
		t.Fatalf("another node's pod after the flood: %d %s", w.Code, w.Body)
	}
	ca.mu.Lock()
	n := ca.nonces.unproven("192.0.2.66")
	ca.mu.Unlock()
	if n > maxMeshNoncesPerSource {
		t.Fatalf("the flooding node holds %d nonces, more than its share of %d", n, maxMeshNoncesPerSource)
	}
}

// TestMaliciousHostFloodsTheKeyBroker: the same against the key broker's
// unauthenticated sessions.
func TestMaliciousHostFloodsTheKeyBroker(t *testing.T) {
	b := &Broker{}
	auth := func(from string) int { return authFrom(b, from) }
	for range maxSessions + 100 {
		if code := auth("192.0.2.66:40000"); code != http.StatusOK {
			t.Fatalf("the flooder's own session: %d", code)
		}
	}
	if code := auth("192.0.2.7:41000"); code != http.StatusOK {
		t.Fatalf("another node's pod after the flood: %d", code)
	}
	b.mu.Lock()
	n := b.sessions.unproven("192.0.2.66")
	b.mu.Unlock()
	if n > maxSessionsPerSource {
		t.Fatalf("the flooding node holds %d sessions, more than its share of %d", n, maxSessionsPerSource)
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

// authFrom asks b for a session from the address from; the status.
func authFrom(b *Broker, from string) int {
	r := httptest.NewRequest(http.MethodPost, kbsapi.AuthPath, stringsReader(`{"version":"0.4.0","tee":"snp","extra-params":{}}`))
	r.RemoteAddr = from
	w := httptest.NewRecorder()
	b.ServeHTTP(w, r)
	return w.Code
}

// The host can have its genuine pods attest again and again (SetInitData
// again, a reset at the resource request, pulls that fail and retry):
// attested sessions, which no flood of challenges drops, are bounded per
// source too, so they cannot fill the table either.
func TestMaliciousHostFloodsTheKeyBrokerWithAttestedSessions(t *testing.T) {
	b := &Broker{}
	auth := func(from string) int { return authFrom(b, from) }
	proveAll := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for id, e := range b.sessions.entries {
			if !e.proven {
				b.sessions.prove(id) // as /attest does for evidence that verified
			}
		}
	}
	for range maxSessions + 100 {
		if code := auth("192.0.2.66:40000"); code != http.StatusOK {
			t.Fatalf("the flooder's own session: %d", code)
		}
		proveAll()
	}
	if code := auth("192.0.2.7:41000"); code != http.StatusOK {
		t.Fatalf("another node's pod after a flood of attested sessions: %d", code)
	}
	b.mu.Lock()
	n := 0
	for _, e := range b.sessions.entries {
		if e.proven && e.source == "192.0.2.66" {
			n++
		}
	}
	b.mu.Unlock()
	if n > maxSessionsPerSource {
		t.Fatalf("the flooding node holds %d attested sessions, more than its share of %d", n, maxSessionsPerSource)
	}
}

// A table full of attested sessions drops the oldest of the source that
// holds the most, when it holds more than one; one each: refused.
func TestChallengesProvenShare(t *testing.T) {
	now := time.Now()
	later := now.Add(time.Hour)
	at := func(i int) time.Time { return now.Add(time.Duration(i) * time.Millisecond) }
	tb := newChallenges[int](4, 2)
	for i := range 3 {
		tb.add(at(i), fmt.Sprint("x", i), "x", later, i)
		tb.prove(fmt.Sprint("x", i))
	}
	if _, ok := tb.get(at(5), "x0"); ok {
		t.Fatal("a source's third attested session kept its first past its share of 2")
	}
	tb.add(at(6), "y0", "y", later, 0)
	tb.prove("y0")
	tb.add(at(7), "z0", "z", later, 0)
	tb.prove("z0")
	if !tb.add(at(8), "w0", "w", later, 0) {
		t.Fatal("a full table refused while one source held two attested sessions")
	}
	for id, want := range map[string]bool{"x1": false, "x2": true, "y0": true, "z0": true, "w0": true} {
		if _, ok := tb.get(at(9), id); ok != want {
			t.Errorf("%s kept: %v, want %v", id, ok, want)
		}
	}
}

// A full table where every source holds as many drops the oldest entry,
// not the source with the smallest name: ten addresses that each hold one
// challenge do not push out a pod's older one. Sources are addresses,
// IPv4-mapped ones as IPv4.
func TestChallengesManyAddresses(t *testing.T) {
	req := func(addr string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.RemoteAddr = addr
		return r
	}
	if s := source(req("[::ffff:10.0.0.5]:1")); s != "10.0.0.5" {
		t.Fatalf("an IPv4-mapped address: source %q", s)
	}
	if a, b := source(req("[2001:db8::1]:1")), source(req("[2001:db8::2]:2")); a == b {
		t.Fatalf("two nodes of one /64 share source %q", a)
	}
	now := time.Now()
	later := now.Add(time.Hour)
	at := func(ms int) time.Time { return now.Add(time.Duration(ms) * time.Millisecond) }
	// Every source holds one: the oldest entry goes, an attacker's,
	// not the pod's for its address sorting first.
	tb := newChallenges[int](4, 4)
	tb.add(at(0), "flood0", "192.0.2.1", later, 0)
	tb.add(at(1), "pod", "10.0.0.5", later, 0)
	tb.add(at(2), "flood1", "192.0.2.2", later, 0)
	tb.add(at(3), "flood2", "192.0.2.3", later, 0)
	tb.add(at(4), "flood3", "192.0.2.4", later, 0)
	if _, ok := tb.get(now, "pod"); !ok {
		t.Fatal("a tie pushed out the pod's challenge, not the oldest")
	}
}
