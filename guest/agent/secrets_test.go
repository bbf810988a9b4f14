package agent

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/kbs"
)

// kbsDoc is init data that asks srv's broker for one secret.
func kbsDoc(t *testing.T, srv *httptest.Server, allowExec bool) []byte {
	t.Helper()
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return fmt.Appendf(nil, "version = \"0.1\"\n[agent_policy]\nallow_exec = %t\n[kbs]\nurl = %q\ncert = '''\n%s'''\n[[kbs.secrets]]\nresource = \"kbs:///default/key/db-password\"\npath = \"/run/secrets/db\"\n",
		allowExec, srv.URL, cert)
}

// snpService is an agent whose evidence carries the digest of doc.
func snpService(t *testing.T, doc []byte) *Service {
	digest := initdata.Digest(doc)
	dir := t.TempDir()
	return &Service{cfg: Config{
		SecretsDir:   dir + "/secrets",
		MountSecrets: func(d string) error { return os.MkdirAll(d, 0o700) },
		Evidence: func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
			r := make([]byte, 1184)
			copy(r[snpHostDataOffset:], digest[:])
			return &agentapi.GetEvidenceResponse{Kind: "snp", Provider: "sim", Report: r}, nil
		},
	}, containers: map[string]*container{}}
}

func fastRetry(t *testing.T, attempts int) {
	old := secretRetry
	secretRetry = kbs.Retry{Attempts: attempts, Backoff: time.Millisecond}
	t.Cleanup(func() { secretRetry = old })
}

// A broker that refuses the pod fails SetInitData: no retry, no secrets,
// and the pod's policy does not take effect.
func TestSetInitDataBrokerRefusal(t *testing.T) {
	fastRetry(t, 3)
	var requests atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"type":"https://github.com/confidential-containers/kbs/errors/AttestationFailed","detail":"measurement mismatch"}`)
	}))
	defer srv.Close()
	doc := kbsDoc(t, srv, false)
	svc := snpService(t, doc)
	_, err := svc.SetInitData(context.Background(), &agentapi.SetInitDataRequest{InitData: doc})
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), srv.URL) || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "measurement mismatch") {
		t.Fatalf("SetInitData = %v: want permission denied naming the broker and its reason", err)
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("the broker saw %d requests: a refusal must not be retried", n)
	}
	if !svc.execAllowed() || len(svc.secretMounts(nil)) != 0 {
		t.Fatal("a pod refused by its broker got its policy or secret mounts")
	}
	if entries, _ := os.ReadDir(svc.cfg.SecretsDir); len(entries) != 0 {
		t.Fatalf("secrets dir has %d entries", len(entries))
	}
}

// An unreachable broker is tried a bounded number of times.
func TestSetInitDataBrokerUnreachable(t *testing.T) {
	fastRetry(t, 3)
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	doc := kbsDoc(t, srv, true)
	srv.Close()
	svc := snpService(t, doc)
	var dials atomic.Int32
	svc.cfg.KBSDial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	_, err := svc.SetInitData(context.Background(), &agentapi.SetInitDataRequest{InitData: doc})
	if err == nil || !strings.Contains(err.Error(), "after 3 attempts") {
		t.Fatalf("SetInitData = %v, want a failure after 3 attempts", err)
	}
	if n := dials.Load(); n != 3 {
		t.Fatalf("%d dials, want 3", n)
	}
}

// SetInitData sent twice at once runs one broker handshake at a time: each
// holds a session in the broker (which one node could otherwise multiply),
// and a second fetch that succeeded after the first would rewrite the
// secrets a container reads.
func TestMaliciousHostSetInitDataConcurrentFetches(t *testing.T) {
	fastRetry(t, 1)
	var inFlight, most atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(200 * time.Millisecond)
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"type":"https://github.com/confidential-containers/kbs/errors/AttestationFailed","detail":"no"}`)
	}))
	defer srv.Close()
	doc := kbsDoc(t, srv, false)
	svc := snpService(t, doc)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := svc.SetInitData(context.Background(), &agentapi.SetInitDataRequest{InitData: doc})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; !errdefs.IsPermissionDenied(err) {
			t.Fatalf("SetInitData = %v, want the broker's refusal", err)
		}
	}
	if n := most.Load(); n != 1 {
		t.Fatalf("%d broker requests at once, want 1: the fetches ran concurrently", n)
	}
}

func TestKeepSecretReplacesWhole(t *testing.T) {
	file := t.TempDir() + "/0"
	if err := os.WriteFile(file, []byte("old"), 0o444); err != nil {
		t.Fatal(err)
	}
	old, _ := os.Open(file)
	defer old.Close()
	if err := keepSecret(file, []byte("new value")); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(file)
	st, _ := os.Stat(file)
	if string(got) != "new value" || st.Mode().Perm() != 0o444 {
		t.Errorf("file %q mode %v", got, st.Mode())
	}
	// A reader of the old file (a container's bind) keeps reading it whole.
	b := make([]byte, 16)
	n, _ := old.ReadAt(b, 0)
	if string(b[:n]) != "old" {
		t.Errorf("the old file now reads %q: it was rewritten in place", b[:n])
	}
}

// A resource the init data lists twice is bound at both of its paths
// (secretMounts), so the policy is given both to check: a path below a
// shared mount is refused whichever entry comes first.
func TestMaliciousHostDuplicateResourceSecretBelowShare(t *testing.T) {
	const res = "kbs:///default/key/tls"
	for _, order := range [][]string{{"/config/tls.key", "/run/secrets/tls.key"}, {"/run/secrets/tls.key", "/config/tls.key"}} {
		svc := &Service{secrets: []secretMount{
			{resource: res, source: "/s/0", destination: order[0]},
			{resource: res, source: "/s/1", destination: order[1]},
		}}
		if got := svc.secretPaths()[res]; !slices.Equal(got, order) {
			t.Errorf("secretPaths()[%s] = %v, want both entries' paths %v", res, got, order)
		}
	}
}
