// Package mesh is the guest side of c8s's attested mesh (guest/api/mesh):
// the agent asks the owner's mesh CA for a workload certificate with
// evidence that binds a key made in guest memory (Client), keeps it and
// its key on a tmpfs where the pod's named containers read them (Store),
// renews it through a fresh attestation at two thirds of its life and
// drops it when the CA refuses (Renewer), and wraps the pod's meshed
// ports in mutual TLS 1.3 with it (Proxy), transparently: the agent
// redirects the meshed TCP of the pod's network namespace to the proxy
// (Redirect: nftables NAT, programmed through netlink), which recovers
// each connection's original destination (OriginalDst). The workload
// listens and dials as it would without a mesh.
//
// Everything here follows the pod's measured init data ([mesh],
// guest/api/initdata Mesh): the CA's address and TLS certificate, the
// mesh CA peers chain to, the identity asked for, the ports and the
// peers. The host relays none of it and chooses none of it, and has no
// netlink access to the guest to change the redirects.
package mesh

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
)

// Evidence returns TEE evidence with reportData in REPORT_DATA: the KBS
// protocol's TEE name and the primary evidence document (as
// guest/kbs.Evidence).
type Evidence func(ctx context.Context, reportData [64]byte) (tee string, evidence []byte, err error)

// Client asks one mesh CA for workload certificates.
type Client struct {
	// URL is the CA's base URL (https://HOST[:PORT]).
	URL string
	// Roots are the only roots the CA endpoint's TLS certificate may
	// chain to (mesh.cert of the init data).
	Roots *x509.CertPool
	// CA is the mesh CA (mesh.ca): an issued certificate must chain to
	// it; CAPEM is its PEM, which the workload reads as ca.pem.
	CA    *x509.CertPool
	CAPEM []byte
	// Identity is the identity the init data asks for; an issued
	// certificate must carry it.
	Identity string
	// Dial opens connections to the CA (the agent: from the pod's network
	// namespace); nil dials TCP.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Evidence produces the TEE evidence.
	Evidence Evidence
	// InitData is the pod's init data (TOML), whose digest the evidence
	// carries.
	InitData []byte
}

// Certificate is a workload certificate and its key.
type Certificate struct {
	// TLS is the certificate with its key, Leaf set.
	TLS tls.Certificate
	// CertPEM, KeyPEM and CAPEM are the files the workload reads.
	CertPEM, KeyPEM, CAPEM []byte
	// Identity is its SPIFFE ID.
	Identity string
}

// Refused is an answer of the CA refusing the pod (4xx): asking again
// with the same evidence cannot help.
type Refused struct {
	Status int
	Detail string
}

func (e *Refused) Error() string {
	msg := fmt.Sprintf("mesh CA refused the certificate: %d %s", e.Status, http.StatusText(e.Status))
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// maxBody bounds what the client reads from the CA.
const maxBody = 1 << 20

// Request makes a key, attests it and returns the certificate the CA
// issued for it.
func (c *Client) Request(ctx context.Context) (*Certificate, error) {
	if c.Roots == nil || c.CA == nil {
		return nil, errors.New("mesh: no pinned CA endpoint certificate or mesh CA")
	}
	dial := c.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	hc := &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			DialContext:         dial,
			TLSClientConfig:     &tls.Config{RootCAs: c.Roots, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: 20 * time.Second,
			Proxy:               nil,
		},
	}
	defer hc.CloseIdleConnections()

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, err
	}
	parsed, err := x509.ParseCertificateRequest(csr)
	if err != nil {
		return nil, err
	}
	var ch meshapi.Challenge
	if err := c.post(ctx, hc, meshapi.ChallengePath, struct{}{}, &ch); err != nil {
		return nil, err
	}
	rd := reportdata.MeshKey(parsed.RawSubjectPublicKeyInfo, ch.Nonce)
	tee, ev, err := c.Evidence(ctx, rd)
	if err != nil {
		return nil, fmt.Errorf("mesh: get TEE evidence: %w", err)
	}
	var resp meshapi.CertificateResponse
	req := meshapi.CertificateRequest{Nonce: ch.Nonce, TEE: tee, Evidence: ev, InitData: string(c.InitData), CSR: csr}
	if err := c.post(ctx, hc, meshapi.CertificatePath, req, &resp); err != nil {
		return nil, err
	}
	return c.accept(&resp, key)
}

// accept checks what the CA sent: a certificate for this key, from the
// mesh CA the init data names, with the identity it asks for.
func (c *Client) accept(resp *meshapi.CertificateResponse, key *ecdsa.PrivateKey) (*Certificate, error) {
	blk, _ := pem.Decode([]byte(resp.Certificate))
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("mesh: the CA's answer holds no PEM certificate")
	}
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("mesh: the issued certificate: %w", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.CA, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("mesh: the issued certificate does not chain to the init data's mesh.ca: %w", err)
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("mesh: the issued certificate is not for this pod's key")
	}
	id, err := meshapi.Identity(leaf)
	if err != nil {
		return nil, fmt.Errorf("mesh: the issued certificate: %w", err)
	}
	if id != c.Identity {
		return nil, fmt.Errorf("mesh: the issued certificate is for %s, the init data asks for %s", id, c.Identity)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	cert := &Certificate{
		TLS:      tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf},
		CertPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw}),
		KeyPEM:   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		CAPEM:    c.CAPEM, // the measured one, not the CA's word
		Identity: id,
	}
	return cert, nil
}

func (c *Client) post(ctx context.Context, hc *http.Client, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.URL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("mesh: %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("mesh: %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("mesh: %s: read the answer: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e meshapi.Error
		_ = json.Unmarshal(data, &e)
		if resp.StatusCode >= 400 && resp.StatusCode < 500 {
			return &Refused{Status: resp.StatusCode, Detail: e.Detail}
		}
		return fmt.Errorf("mesh: %s: the CA answered %s: %s", path, resp.Status, e.Detail)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("mesh: %s: the answer is not the expected JSON: %w", path, err)
	}
	return nil
}

// Permanent reports whether retrying err cannot help: the CA, behind its
// pinned endpoint certificate, refused. Nothing else is the CA's word: an
// endpoint certificate that is not the pinned one is what a host that
// intercepts the connection answers, as unreachable is, and the pod keeps
// its certificate until it expires (a misconfigured pin fails alike,
// retried).
func Permanent(err error) bool {
	var r *Refused
	return errors.As(err, &r)
}
