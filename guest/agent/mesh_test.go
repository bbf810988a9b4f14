package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"path/filepath"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
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
