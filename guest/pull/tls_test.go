package pull

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// otherRoots is a pool of a CA that did not sign the registry's
// certificate.
func otherRoots(t *testing.T) *x509.CertPool {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	p.AddCert(c)
	return p
}

// The registry's certificate is verified against Options.Roots and
// nothing else: the transport's own roots (here the client of the test
// server, which trusts its certificate, as a host's bundle would) are
// dropped; a certificate that does not chain to Roots fails the pull at
// the handshake, before any request, so no credentials reach that server;
// the right CA is accepted.
func TestPullVerifiesRegistryAgainstRootsOnly(t *testing.T) {
	tr := newRegistry(t, true)
	ref := tr.push(t, "app", newImage(t, baseLayers(t), nil))
	var withCreds atomic.Int64
	basicAuth(tr, "u", "p", &withCreds)
	auth := &authn.AuthConfig{Username: "u", Password: "p"}
	trusting := tr.srv.Client().Transport // trusts the server's certificate

	n := tr.count.Load()
	dir, _, err := pullTo(t, ref, Options{Transport: trusting, Roots: otherRoots(t), Auth: auth})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("the wrong CA: err = %v, want the registry's certificate refused", err)
	}
	if got := tr.count.Load() - n; got != 0 {
		t.Errorf("the registry whose certificate failed got %d requests", got)
	}
	if withCreds.Load() != 0 {
		t.Errorf("%d requests with credentials reached the registry whose certificate failed", withCreds.Load())
	}
	assertEmpty(t, dir)

	// No roots at all: refused before any connection, naming pull_ca.
	if _, _, err := pullTo(t, ref, Options{Transport: trusting, Auth: auth}); err == nil || !strings.Contains(err.Error(), "pull_ca") {
		t.Fatalf("no roots: err = %v, want pull_ca named", err)
	}
	if got := tr.count.Load() - n; got != 0 {
		t.Errorf("%d requests without roots", got)
	}

	// The registry's CA: pulled, with the credentials.
	if _, img, err := pullTo(t, ref, Options{Transport: trusting, Roots: tr.roots(), Auth: auth}); err != nil || img == nil {
		t.Fatalf("the right CA: %v", err)
	}
	if withCreds.Load() == 0 {
		t.Error("no request carried the credentials")
	}
}

// A transport whose roots the pull cannot pin is refused, rather than
// trusted with whatever roots it has.
func TestPullRefusesUnpinnableTransport(t *testing.T) {
	tr := newRegistry(t, true)
	ref := tr.push(t, "app", newImage(t, baseLayers(t), nil))
	rt := GuardTransport(tr.srv.Client().Transport, false) // not an *http.Transport
	if _, _, err := pullTo(t, ref, Options{Transport: rt, Roots: tr.roots()}); err == nil || !strings.Contains(err.Error(), "pins its TLS roots") {
		t.Fatalf("err = %v", err)
	}
}
