package migrate

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// testCA issues node certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// node writes a TLS identity for a node into dir.
func (ca *testCA) node(t *testing.T, dir, name string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for f, b := range map[string][]byte{
		TLSCertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		TLSKeyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
		TLSCAFile:   ca.pem,
	} {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// Between nodes the API runs over mutual TLS: a member of the pool gets
// answers, a client without a certificate or with another pool's is
// refused.
func TestAPIOverMutualTLS(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"vmlinuz", "initrd.img", "bios.bin"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := config.Default()
	cfg.Hypervisor.Kernel, cfg.Hypervisor.Initrd, cfg.Hypervisor.Firmware = filepath.Join(root, "vmlinuz"), filepath.Join(root, "initrd.img"), filepath.Join(root, "bios.bin")
	cfg.Runtime.StateDir = filepath.Join(root, "b")
	cfg.Node.TrustPool = "p1"
	pool := newTestCA(t, "pool p1")
	pool.node(t, statedir.MigrateTLS(cfg.Runtime.StateDir), "node-b")
	serverTLS, _, err := LoadTLS(statedir.MigrateTLS(cfg.Runtime.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	l, err := ListenTLS("127.0.0.1:0", serverTLS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { (&Server{Config: cfg, Name: "node-b"}).Serve(ctx, l); close(served) }()
	t.Cleanup(func() { stop(); <-served })
	addr := "tls://" + l.Addr().String()

	a := cfg
	a.Runtime.StateDir = filepath.Join(root, "a")
	pool.node(t, statedir.MigrateTLS(a.Runtime.StateDir), "node-a")
	c, err := Dial(addr, a)
	if err != nil {
		t.Fatal(err)
	}
	// tls:// goes through the node's own server, which holds its identity.
	if _, err := c.Node(ctx); err == nil || !strings.Contains(err.Error(), "c8s-launcher serve") {
		t.Fatalf("Node without the node's relay: %v; want an error naming c8s-launcher serve", err)
	}
	serveRelay(t, a)
	n, err := c.Node(ctx)
	if err != nil || n.Name != "node-b" || n.TrustPool != "p1" || n.ChipID == "" {
		t.Fatalf("Node over mTLS = %+v, %v", n, err)
	}
	if _, err := c.DialAgent(ctx, "nope"); err == nil || !strings.Contains(err.Error(), `no VM "nope"`) {
		t.Fatalf("agent tunnel to an unknown VM: %v", err)
	}

	caPool := x509.NewCertPool()
	caPool.AppendCertsFromPEM(pool.pem)
	anon, err := NewTLSClient(l.Addr().String(), &tls.Config{RootCAs: caPool, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.Node(ctx); err == nil {
		t.Fatal("a client without a certificate got an answer")
	}
	other := cfg
	other.Runtime.StateDir = filepath.Join(root, "c")
	newTestCA(t, "pool p2").node(t, statedir.MigrateTLS(other.Runtime.StateDir), "node-c")
	serveRelay(t, other)
	stranger, err := Dial(addr, other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stranger.Node(ctx); err == nil {
		t.Fatal("a client of another pool's CA got an answer")
	}
	if _, err := Dial("ftp://x", a); err == nil || !strings.Contains(err.Error(), "tls://HOST:PORT") {
		t.Fatalf("Dial with an unknown scheme: %v", err)
	}
}

// serveRelay runs the server of node cfg on its unix socket, whose TLS
// relay its clients reach tls:// destinations through.
func serveRelay(t *testing.T, cfg config.Config) string {
	sock, _ := serveRelayServer(t, cfg)
	return sock
}

// serveRelayServer is serveRelay, with the server (one per node: its
// other listeners are served by the same one).
func serveRelayServer(t *testing.T, cfg config.Config) (string, *Server) {
	t.Helper()
	sock := statedir.MigrateSocket(cfg.Runtime.StateDir)
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan struct{})
	srv := &Server{Config: cfg, Name: filepath.Base(cfg.Runtime.StateDir)}
	go func() { srv.Serve(ctx, l); close(served) }()
	t.Cleanup(func() { stop(); <-served })
	return sock, srv
}

// The relay serves the node's own callers on its unix socket only: a
// pool member on the TLS listener may not borrow the node's identity; and
// it dials mutual TLS only, so a destination that does not speak it is
// refused (plain TCP between nodes stays refused).
func TestRelayOnlyForLocalCallersAndOnlyTLS(t *testing.T) {
	root := t.TempDir()
	cfg := config.Default()
	cfg.Runtime.StateDir = filepath.Join(root, "a")
	pool := newTestCA(t, "pool p1")
	identity := statedir.MigrateTLS(cfg.Runtime.StateDir)
	pool.node(t, identity, "node-a")
	sock, srv := serveRelayServer(t, cfg)
	serverTLS, clientTLS, err := LoadTLS(identity)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// A pool member on node A's TLS listener asks for the relay.
	tl, err := ListenTLS("127.0.0.1:0", serverTLS)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { srv.Serve(sctx, tl); close(served) }()
	t.Cleanup(func() { stop(); <-served })
	member, err := NewTLSClient(tl.Addr().String(), clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := member.dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := upgrade(ctx, conn, "/v1/relay?to="+tl.Addr().String(), relayUpgrade); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("relay asked over TLS: %v; want 403", err)
	}

	// A destination on plain TCP.
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
			c.Close()
		}
	}()
	c, err := relayClient(sock, plain.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Node(ctx); err == nil || !strings.Contains(err.Error(), "502") {
		t.Fatalf("relay to a plain TCP destination: %v; want 502", err)
	}
	// The same socket relays to the TLS listener (a member of the pool).
	c, err = relayClient(sock, tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Status(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("status of an unknown VM through the relay to a pool member: %v; want ErrNotFound", err)
	}
	if _, err := relayClient(sock, "no-port"); err == nil || !strings.Contains(err.Error(), "HOST:PORT") {
		t.Fatalf("relay client for a bad address: %v", err)
	}
}

// Listen leaves no moment in which another user can reach the socket that
// lends the node's identity: its directory is made 0700, even one that
// existed with a wider mode, and the socket is 0600.
func TestListenKeepsTheSocketPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "node")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "migrate.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for path, want := range map[string]os.FileMode{dir: 0o700, sock: 0o600} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got != want {
			t.Errorf("%s has mode %o, want %o", path, got, want)
		}
	}
}
