package migrate

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/migrate/pooltest"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// fakeGuest stands for a destination QEMU; its agent channel echoes lines.
type fakeGuest struct {
	done    chan struct{}
	once    sync.Once
	stopped bool
}

func newFakeGuest() *fakeGuest { return &fakeGuest{done: make(chan struct{})} }

func (g *fakeGuest) Pid() int                                 { return 4242 }
func (g *fakeGuest) Done() <-chan struct{}                    { return g.done }
func (g *fakeGuest) Err() error                               { return nil }
func (g *fakeGuest) RunState(context.Context) (string, error) { return "running", nil }
func (g *fakeGuest) Stop(context.Context) error {
	g.once.Do(func() { g.stopped = true; close(g.done) })
	return nil
}
func (g *fakeGuest) DialAgent(context.Context) (net.Conn, error) {
	a, b := net.Pipe()
	go func() {
		defer b.Close()
		r := bufio.NewReader(b)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := b.Write([]byte("echo " + line)); err != nil {
				return
			}
		}
	}()
	return a, nil
}

// adopt makes the server run g as VM id on behalf of the holder of cert
// (nil: the unix socket), as its Incoming would.
func (s *Server) adopt(id string, g guest, cert *x509.Certificate) {
	owner := localPeer
	if cert != nil {
		sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
		owner = peer{id: "spki-sha256:" + hex.EncodeToString(sum[:]), cert: cert}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vms == nil {
		s.vms = map[string]*hostedVM{}
	}
	s.vms[id] = &hostedVM{vm: g, stopHost: func() {}, owner: owner}
}

// fakeImages gives cfg guest image files to hash (LocalNode) and returns it.
func fakeImages(t *testing.T, cfg config.Config, dir string) config.Config {
	for _, f := range []string{"vmlinuz", "initrd.img", "bios.bin"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Hypervisor.Kernel, cfg.Hypervisor.Initrd, cfg.Hypervisor.Firmware = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img"), filepath.Join(dir, "bios.bin")
	return cfg
}

// A VM that a pool member migrated here answers that member only: another
// member's certificate from the same CA, and the local unix socket, are
// refused (403, naming the owner) for status, wait, the agent channel and
// deletion, and leave the VM running.
func TestVMBoundToItsPeer(t *testing.T) {
	root := t.TempDir()
	cfg := fakeImages(t, config.Default(), root)
	cfg.Runtime.StateDir = filepath.Join(root, "b")
	cfg.Node.TrustPool = "p1"
	ca, err := pooltest.NewCA("pool p1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Issue(statedir.MigrateTLS(cfg.Runtime.StateDir), "node-b"); err != nil {
		t.Fatal(err)
	}
	serverTLS, _, err := LoadTLS(statedir.MigrateTLS(cfg.Runtime.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	tl, err := ListenTLS("127.0.0.1:0", serverTLS)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "b.sock")
	ul, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Config: cfg, Name: "node-b"}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range []net.Listener{tl, ul} {
		wg.Add(1)
		go func() { defer wg.Done(); srv.Serve(ctx, l) }()
	}
	t.Cleanup(func() { stop(); wg.Wait() })

	member := func(name string) (*Client, *x509.Certificate) {
		c := cfg
		c.Runtime.StateDir = filepath.Join(root, name)
		cert, err := ca.Issue(statedir.MigrateTLS(c.Runtime.StateDir), name)
		if err != nil {
			t.Fatal(err)
		}
		serveRelay(t, c) // the member's own server relays its tls:// calls
		cl, err := Dial("tls://"+tl.Addr().String(), c)
		if err != nil {
			t.Fatal(err)
		}
		return cl, cert
	}
	owner, ownerCert := member("node-a")
	other, _ := member("node-c")
	local := NewClient(sock)

	g := newFakeGuest()
	srv.adopt("pod1", g, ownerCert)

	for name, c := range map[string]*Client{"another pool member": other, "the unix socket": local} {
		t.Run("refused: "+name, func(t *testing.T) {
			caller := map[string]string{"another pool member": `pool member "CN=node-c"`, "the unix socket": "a caller on the local unix socket"}[name]
			refused := func(what string, err error) {
				t.Helper()
				if err == nil || !strings.Contains(err.Error(), `VM "pod1" was migrated here by pool member "CN=node-a"`) || !strings.Contains(err.Error(), "; "+caller) || !strings.Contains(err.Error(), "may not use it") {
					t.Fatalf("%s by %s = %v; want a refusal naming the owner and the caller", what, name, err)
				}
			}
			_, err := c.Status(ctx, "pod1")
			refused("status", err)
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = c.Wait(wctx, "pod1")
			cancel()
			refused("wait", err)
			_, err = c.DialAgent(ctx, "pod1")
			if err == nil || !strings.Contains(err.Error(), "403 Forbidden") {
				t.Fatalf("agent channel by %s = %v; want 403", name, err)
			}
			refused("agent channel", err)
			refused("delete", c.Delete(ctx, "pod1"))
			if g.stopped {
				t.Fatalf("the VM was stopped on a request by %s", name)
			}
		})
	}
	if _, err := other.Status(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("status of an unknown VM = %v, want not found", err)
	}

	t.Run("allowed: the owner", func(t *testing.T) {
		st, err := owner.Status(ctx, "pod1")
		if err != nil || st.RunState != "running" || st.Pid != 4242 {
			t.Fatalf("status by the owner = %+v, %v", st, err)
		}
		conn, err := owner.DialAgent(ctx, "pod1")
		if err != nil {
			t.Fatalf("agent channel by the owner: %v", err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write([]byte("hello\n")); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "echo hello\n" {
			t.Fatalf("through the owner's agent channel: %q, %v", line, err)
		}
		conn.Close()
		if err := owner.Delete(ctx, "pod1"); err != nil || !g.stopped {
			t.Fatalf("delete by the owner = %v (stopped %v)", err, g.stopped)
		}
		if _, err := owner.Status(ctx, "pod1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("status after the owner's delete = %v", err)
		}
	})

	t.Run("unix socket owner", func(t *testing.T) {
		g := newFakeGuest()
		srv.adopt("pod2", g, nil)
		if _, err := local.Status(ctx, "pod2"); err != nil {
			t.Fatalf("status by the local owner: %v", err)
		}
		if err := other.Delete(ctx, "pod2"); err == nil || !strings.Contains(err.Error(), "by a caller on the local unix socket; pool member \"CN=node-c\"") {
			t.Fatalf("delete by a pool member of a VM the unix socket created = %v", err)
		}
		if err := local.Delete(ctx, "pod2"); err != nil || !g.stopped {
			t.Fatalf("delete by the local owner = %v (stopped %v)", err, g.stopped)
		}
	})
}

// Incoming refuses, before any QEMU starts, disks outside the shared
// storage root and a node without a TLS identity unless plain_loopback.
func TestIncomingRefusals(t *testing.T) {
	root := t.TempDir()
	cfg := fakeImages(t, config.Default(), root)
	cfg.Runtime.StateDir = filepath.Join(root, "b")
	cfg.Node.TrustPool = "p1"
	shared := filepath.Join(root, "shared")
	if err := os.MkdirAll(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg.Migration.SharedStorageRoot = shared
	private := filepath.Join(root, "private.img")
	if err := os.WriteFile(private, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := &Server{Config: cfg, Name: "node-b"}
	src, err := LocalNode(cfg, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	req := IncomingRequest{ID: "pod1", Source: src, Shape: Shape{VCPUs: 1, MemoryMiB: 64}, Disks: []vm.Disk{{ID: "rootfs", Path: private}}}
	ctx := context.Background()
	_, code, err := srv.incoming(ctx, req, localPeer)
	if code != 403 || err == nil || !strings.Contains(err.Error(), private) || !strings.Contains(err.Error(), shared) {
		t.Fatalf("incoming with a disk outside the root = %d, %v; want 403 naming %s and %s", code, err, private, shared)
	}
	req.Disks = nil
	_, code, err = srv.incoming(ctx, req, localPeer)
	if code != 503 || err == nil || !strings.Contains(err.Error(), "no migration TLS identity") {
		t.Fatalf("incoming on a node without a TLS identity = %d, %v; want 503", code, err)
	}
	srv.MigrationHost = "192.0.2.1"
	srv.Config.Migration.PlainLoopback = true
	_, code, err = srv.incoming(ctx, req, localPeer)
	if code != 503 || err == nil || !strings.Contains(err.Error(), "plain TCP on 192.0.2.1") {
		t.Fatalf("incoming off loopback without a TLS identity = %d, %v; want 503", code, err)
	}
	if len(srv.vms) != 0 {
		t.Fatalf("refused requests left %d VM entries", len(srv.vms))
	}
}
