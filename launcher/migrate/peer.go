package migrate

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net/http"
)

// peer is who calls the destination API: a pool member, known by the
// certificate it presented on mutual TLS, or a local caller on the unix
// socket (0600: root on this node).
type peer struct {
	// id identifies the caller: "spki-sha256:<hex>" of the certificate's
	// public key, or "unix".
	id string
	// cert is the caller's certificate (nil on the unix socket).
	cert *x509.Certificate
}

// localPeer is every caller on the unix socket.
var localPeer = peer{id: "unix"}

// peerOf returns the caller of r.
func peerOf(r *http.Request) peer {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return localPeer
	}
	c := r.TLS.PeerCertificates[0]
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return peer{id: "spki-sha256:" + hex.EncodeToString(sum[:]), cert: c}
}

// String names the caller in errors and logs.
func (p peer) String() string {
	if p.cert == nil {
		return "a caller on the local unix socket"
	}
	return fmt.Sprintf("pool member %q (%.28s…)", p.cert.Subject.String(), p.id)
}

// errNotOwner is the refusal of a request about a VM that another caller
// migrated here.
func errNotOwner(id string, owner, caller peer) error {
	return fmt.Errorf("VM %q was migrated here by %s; %s may not use it", id, owner, caller)
}
