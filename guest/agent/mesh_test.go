package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/nftables"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
	"github.com/c8s-dev/c8s/guest/mesh"
	"github.com/c8s-dev/c8s/guest/policy"
)

func testCertPEM(t *testing.T) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "t"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// The mesh files go, read-only, into the containers the init data names,
// and into no other (the sandbox never).
func TestMeshMountsNamedContainersOnly(t *testing.T) {
	cert := testCertPEM(t)
	raw := []byte(fmt.Sprintf("version = \"0.1\"\n[mesh]\nurl = \"https://10.0.0.1:8443\"\ncert = '''\n%s'''\nca = '''\n%s'''\nidentity = \"spiffe://c8s.test/ns/default/sa/app\"\ncontainers = [\"app\"]\n", cert, cert))
	doc, err := initdata.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{SecretsDir: filepath.Join(t.TempDir(), "secrets")}}
	ctx := context.Background()
	app := &policy.Container{ID: "c1", Identity: policy.Identity{Type: policy.ContainerTypeContainer, Name: "app"}}
	if got := s.meshMounts(ctx, app); len(got) != 0 {
		t.Fatalf("before the init data: %v", got)
	}
	s.setMesh(doc, raw)
	got := s.meshMounts(ctx, app)
	if len(got) != 1 || got[0].Destination != meshapi.Dir || got[0].Source != s.meshDir() {
		t.Fatalf("mounts of app: %+v", got)
	}
	ro := false
	for _, o := range got[0].Options {
		ro = ro || o == "ro"
	}
	if !ro {
		t.Fatalf("the mesh files are mounted writable: %v", got[0].Options)
	}
	for _, c := range []*policy.Container{
		{ID: "c2", Identity: policy.Identity{Type: policy.ContainerTypeContainer, Name: "other"}},
		{ID: "sb", Identity: policy.Identity{Type: policy.ContainerTypeSandbox, Name: policy.ContainerTypeSandbox}},
		nil,
	} {
		if got := s.meshMounts(ctx, c); len(got) != 0 {
			t.Fatalf("mounts of %+v: %v", c, got)
		}
	}
	if filepath.Base(s.meshDir()) != "mesh" || filepath.Dir(s.meshDir()) != filepath.Dir(s.cfg.SecretsDir) {
		t.Fatalf("mesh dir %s is not beside the secrets", s.meshDir())
	}
}

// fakeTables records the agent's nftables batch.
type fakeTables struct {
	rules   int
	chains  []string
	flushed bool
	err     error
}

func (f *fakeTables) AddTable(t *nftables.Table) *nftables.Table { return t }
func (f *fakeTables) DelTable(*nftables.Table)                   {}
func (f *fakeTables) AddChain(c *nftables.Chain) *nftables.Chain {
	f.chains = append(f.chains, c.Name)
	return c
}
func (f *fakeTables) AddRule(r *nftables.Rule) *nftables.Rule { f.rules++; return r }
func (f *fakeTables) Flush() error                            { f.flushed = true; return f.err }

// A mesh pod loads the netfilter modules (a pod without a mesh does not),
// and its sandbox starts only with the redirects in place: a pod whose
// meshed ports cannot be intercepted would serve and send them in
// plaintext. unmeshed = "refuse" adds the filter chains.
func TestStartMeshInstallsRedirects(t *testing.T) {
	cert := testCertPEM(t)
	raw := []byte(fmt.Sprintf("version = \"0.1\"\n[mesh]\nurl = \"https://127.0.0.1:1\"\ncert = '''\n%s'''\nca = '''\n%s'''\nidentity = \"spiffe://c8s.test/ns/default/sa/app\"\ncontainers = [\"app\"]\nunmeshed = \"refuse\"\n"+
		"[[mesh.inbound]]\nport = 8080\nallow = [\"spiffe://c8s.test/ns/default/sa/web\"]\n[[mesh.outbound]]\nport = 5432\nidentity = \"spiffe://c8s.test/ns/default/sa/db\"\n", cert, cert))
	doc, err := initdata.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := initdata.Parse([]byte("version = \"0.1\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	var loads atomic.Int32
	newService := func() *Service {
		return &Service{cfg: Config{
			SecretsDir:    filepath.Join(t.TempDir(), "secrets"),
			MountSecrets:  func(dir string) error { return os.MkdirAll(dir, 0o755) },
			LoadNetfilter: func() { loads.Add(1) },
		}}
	}
	pn := &agentapi.PodNetwork{Interfaces: []*agentapi.NetInterface{{Name: "eth0"}}}
	ctx := context.Background()

	s := newService()
	s.setMesh(plain, []byte("version = \"0.1\"\n"))
	if err := s.startMesh(ctx, "sb", pn, os.Getpid()); err != nil || s.mesh.proxy != nil {
		t.Fatalf("no mesh: %v", err)
	}
	if loads.Load() != 0 {
		t.Fatal("a pod without a mesh loaded the netfilter modules")
	}

	orig := meshTables
	t.Cleanup(func() { meshTables = orig })
	for _, fail := range []bool{true, false} {
		f := &fakeTables{}
		if fail {
			f.err = errors.New("EPERM")
		}
		meshTables = func(int) (mesh.NFTables, error) { return f, nil }
		s := newService()
		s.setMesh(doc, raw)
		err := s.startMesh(ctx, "sb", pn, os.Getpid())
		if fail {
			if err == nil || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "EPERM") || s.mesh.proxy != nil {
				t.Fatalf("redirects refused: startMesh = %v, proxy %v", err, s.mesh.proxy)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if !f.flushed || f.rules == 0 || strings.Join(f.chains, " ") != "inbound outbound guard-out refuse-in refuse-out" {
			t.Fatalf("redirects: flushed %v, %d rules, chains %v", f.flushed, f.rules, f.chains)
		}
		s.stopMesh("sb")
	}
	if loads.Load() != 2 {
		t.Fatalf("netfilter loaded %d times for two mesh pods", loads.Load())
	}
}

// TestMaliciousHostSandboxRacesSetInitData: the host creates the pod's
// sandbox while SetInitData is still running. The create passes
// requirePolicy as soon as the policy is in force, so the mesh must be
// known by then: a sandbox created first would otherwise start no mesh,
// and the pod's meshed ports would run in plaintext on the host's network.
func TestMaliciousHostSandboxRacesSetInitData(t *testing.T) {
	cert := testCertPEM(t)
	raw := []byte(fmt.Sprintf("version = \"0.1\"\n[mesh]\nurl = \"https://127.0.0.1:1\"\ncert = '''\n%s'''\nca = '''\n%s'''\nidentity = \"spiffe://c8s.test/ns/default/sa/app\"\ncontainers = [\"app\"]\n"+
		"[[mesh.inbound]]\nport = 8080\nallow = [\"spiffe://c8s.test/ns/default/sa/web\"]\n", cert, cert))
	svc := snpService(t, raw)
	f := &fakeTables{}
	orig := meshTables
	meshTables = func(int) (mesh.NFTables, error) { return f, nil }
	t.Cleanup(func() { meshTables = orig; testHookPolicyInForce = nil })
	pn := &agentapi.PodNetwork{Interfaces: []*agentapi.NetInterface{{Name: "eth0"}}}
	var raced bool
	testHookPolicyInForce = func(s *Service) {
		// The host's CreateContainer of the sandbox, in the window.
		if err := s.requirePolicy(context.Background(), "sandbox"); err != nil {
			t.Errorf("requirePolicy once the policy is in force: %v", err)
		}
		if err := s.startMesh(context.Background(), "sb", pn, os.Getpid()); err != nil {
			t.Errorf("startMesh: %v", err)
		}
		s.mesh.mu.Lock()
		raced = s.mesh.proxy != nil
		s.mesh.mu.Unlock()
	}
	if _, err := svc.SetInitData(ctxT(t), &agentapi.SetInitDataRequest{InitData: raw}); err != nil {
		t.Fatal(err)
	}
	if !raced || !f.flushed {
		t.Fatalf("a sandbox created as the policy took effect started no mesh (proxy %v, redirects flushed %v): its meshed ports would run in plaintext", raced, f.flushed)
	}
	svc.stopMesh("sb")
}
