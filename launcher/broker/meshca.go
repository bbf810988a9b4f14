package broker

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"

	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/guest/api/mesh"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
)

// DefaultMeshLifetime is how long a workload certificate is valid; the
// pod renews it through a fresh attestation at two thirds of that.
const DefaultMeshLifetime = time.Hour

// meshNonceTTL bounds the time between a challenge and its answer.
const meshNonceTTL = 2 * time.Minute

// maxMeshNonces bounds the outstanding challenges, and
// maxMeshNoncesPerSource those of one client address (challenges).
const (
	maxMeshNonces          = 4096
	maxMeshNoncesPerSource = 256
)

// MeshCA is the owner's mesh CA (guest/api/mesh): an http.Handler that
// issues a pod a short-lived workload certificate only once its evidence
// verifies as the key broker's does (its Broker's verifier, the owner's
// reference values, attestation policy and init data pins, no host that
// can run code in the pod) with the certificate's key bound in
// REPORT_DATA under reportdata.MeshKey and a fresh single-use nonce, and
// the owner's resource policy gives the identity the pod's measured init
// data asks for to a workload the pod is (ResourcePolicy.AllowIdentity).
//
// The certificate's URI SAN is that identity; c8s-private extensions carry
// the init data digest, the TEE and the launch measurement the evidence
// showed. It is valid for Lifetime.
type MeshCA struct {
	// Cert and Key are the CA's: every workload certificate is signed by
	// Key and chains to Cert.
	Cert *x509.Certificate
	Key  crypto.Signer
	// Lifetime of workload certificates (default DefaultMeshLifetime); a
	// certificate never outlives Cert.
	Lifetime time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	mu     sync.Mutex
	b      *Broker
	nonces *challenges[struct{}]
}

// NewMeshCA returns a CA that verifies evidence with b's settings
// (Verifier, Policy, References, InitData, AnyInitData,
// AllowUnconfinedHost, ResourcePolicy; its sessions and resources are not
// used, and it is only read).
func NewMeshCA(b *Broker, cert *x509.Certificate, key crypto.Signer) *MeshCA {
	return &MeshCA{Cert: cert, Key: key, b: b, nonces: newChallenges[struct{}](maxMeshNonces, maxMeshNoncesPerSource)}
}

// SetBroker replaces the verification settings, as when the owner's
// policy is reloaded: later requests are judged by b.
func (ca *MeshCA) SetBroker(b *Broker) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	ca.b = b
}

func (ca *MeshCA) now() time.Time {
	if ca.Now != nil {
		return ca.Now()
	}
	return time.Now()
}

// ServeHTTP implements http.Handler.
func (ca *MeshCA) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == mesh.ChallengePath && r.Method == http.MethodPost:
		ca.challenge(w, r)
	case r.URL.Path == mesh.CertificatePath && r.Method == http.MethodPost:
		ca.certificate(w, r)
	default:
		meshProblem(w, http.StatusNotFound, fmt.Sprintf("%s %s is not a mesh CA endpoint", r.Method, r.URL.Path))
	}
}

func meshProblem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(mesh.Error{Detail: detail})
}

func (ca *MeshCA) challenge(w http.ResponseWriter, r *http.Request) {
	nonce := make([]byte, mesh.NonceSize)
	if _, err := rand.Read(nonce); err != nil {
		meshProblem(w, http.StatusInternalServerError, err.Error())
		return
	}
	now := ca.now()
	ca.mu.Lock()
	// Never full: a nonce is unproven until it is taken.
	ca.nonces.add(now, string(nonce), source(r), now.Add(meshNonceTTL), struct{}{})
	ca.mu.Unlock()
	reply(w, mesh.Challenge{Nonce: nonce})
}

// takeNonce consumes a nonce: true if it was outstanding and fresh.
func (ca *MeshCA) takeNonce(n []byte) bool {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	_, ok := ca.nonces.take(ca.now(), string(n))
	return ok
}

func (ca *MeshCA) broker() *Broker {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.b
}

// meshError is a refusal and its HTTP status.
type meshError struct {
	status int
	err    error
}

func (e *meshError) Error() string { return e.err.Error() }
func (e *meshError) Unwrap() error { return e.err }

func refuse(status int, format string, args ...any) *meshError {
	return &meshError{status, fmt.Errorf(format, args...)}
}

func (ca *MeshCA) certificate(w http.ResponseWriter, r *http.Request) {
	l := log.G(r.Context())
	var req mesh.CertificateRequest
	if err := readJSON(r, &req); err != nil {
		meshProblem(w, http.StatusBadRequest, "the request is not the mesh protocol's JSON: "+err.Error())
		return
	}
	resp, id, err := ca.Issue(&req)
	if err != nil {
		status := http.StatusInternalServerError
		var me *meshError
		if errors.As(err, &me) {
			status = me.status
		}
		l.WithError(err).Warn("mesh CA: refused")
		meshProblem(w, status, err.Error())
		return
	}
	l.WithField("identity", id.identity).WithField("init_data", id.attested.InitDataDigest.String()).
		WithField("tee", id.attested.TEE).WithField("not_after", id.notAfter.UTC().Format(time.RFC3339)).Info("mesh CA: issued")
	reply(w, resp)
}

// issued is what Issue gave, for the log.
type issued struct {
	identity string
	attested *Attested
	notAfter time.Time
}

// Issue judges a certificate request and issues the certificate. A
// refusal's error says what failed.
func (ca *MeshCA) Issue(req *mesh.CertificateRequest) (*mesh.CertificateResponse, *issued, error) {
	if len(req.Nonce) != mesh.NonceSize || !ca.takeNonce(req.Nonce) {
		return nil, nil, refuse(http.StatusUnauthorized, "the nonce is not an outstanding challenge of this CA (expired, answered already, or never given): ask for a new one")
	}
	if req.TEE != kbsapi.TeeSNP && req.TEE != kbsapi.TeeTDX {
		return nil, nil, refuse(http.StatusBadRequest, "TEE %q: want snp or tdx", req.TEE)
	}
	csr, err := x509.ParseCertificateRequest(req.CSR)
	if err != nil {
		return nil, nil, refuse(http.StatusBadRequest, "csr: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, nil, refuse(http.StatusBadRequest, "csr: the signature does not verify with its own key: %v", err)
	}
	if err := checkWorkloadKey(csr.PublicKey); err != nil {
		return nil, nil, refuse(http.StatusBadRequest, "csr: %v", err)
	}
	b := ca.broker()
	if b == nil {
		return nil, nil, errors.New("the mesh CA has no verification settings")
	}
	// The evidence must bind this key and this nonce: evidence made for
	// the host, a key broker or another key does not.
	rd := reportdata.MeshKey(csr.RawSubjectPublicKeyInfo, req.Nonce)
	a, err := b.verifyPrimary(req.TEE, req.Evidence, rd[:], &kbsapi.InitData{Format: "toml", Body: req.InitData})
	if err != nil {
		return nil, nil, refuse(http.StatusUnauthorized, "attestation refused: %v", err)
	}
	if a.InitData == nil || !a.InitData.Mesh.Enabled() {
		return nil, nil, refuse(http.StatusForbidden, "the pod's measured init data has no [mesh] section, so it asks for no identity")
	}
	identity := a.InitData.Mesh.Identity
	if err := b.ResourcePolicy.AllowIdentity(identity, a); err != nil {
		return nil, nil, &meshError{http.StatusForbidden, err}
	}
	der, notAfter, err := ca.sign(csr, identity, a)
	if err != nil {
		return nil, nil, err
	}
	return &mesh.CertificateResponse{
		Certificate: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		CA:          string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})),
	}, &issued{identity, a, notAfter}, nil
}

// checkWorkloadKey accepts ECDSA P-256 / P-384 and Ed25519 keys.
func checkWorkloadKey(k any) error {
	switch k := k.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() || k.Curve == elliptic.P384() {
			return nil
		}
		return fmt.Errorf("ECDSA on %s: want P-256 or P-384", k.Curve.Params().Name)
	case ed25519.PublicKey:
		return nil
	}
	return fmt.Errorf("%T keys are not accepted: want ECDSA P-256 / P-384 or Ed25519", k)
}

// sign issues the workload certificate.
func (ca *MeshCA) sign(csr *x509.CertificateRequest, identity string, a *Attested) ([]byte, time.Time, error) {
	u, err := url.Parse(identity)
	if err != nil {
		return nil, time.Time{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, time.Time{}, err
	}
	life := ca.Lifetime
	if life <= 0 {
		life = DefaultMeshLifetime
	}
	now := ca.now()
	notAfter := now.Add(life)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	measurement := a.Measurement
	if a.TEE == kbsapi.TeeTDX {
		measurement = a.MRTD
	}
	var exts []pkix.Extension
	for _, e := range []struct {
		id  asn1.ObjectIdentifier
		val any
		p   string
	}{
		{mesh.OIDInitDataDigest, []byte(a.InitDataDigest), ""},
		{mesh.OIDTEE, a.TEE, "utf8"},
		{mesh.OIDLaunchMeasurement, []byte(measurement), ""},
	} {
		v, err := asn1.MarshalWithParams(e.val, e.p)
		if err != nil {
			return nil, time.Time{}, err
		}
		exts = append(exts, pkix.Extension{Id: e.id, Value: v})
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: strings.TrimPrefix(u.Path, "/")},
		NotBefore:             now.Add(-time.Minute), // the guest's clock may lag
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{u},
		ExtraExtensions:       exts,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, csr.PublicKey, ca.Key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("sign the workload certificate: %w", err)
	}
	return der, notAfter, nil
}

// NewMeshCAKey returns a new self-signed mesh CA certificate for the
// trust domain and its ECDSA P-256 key, both PEM: what `c8s-launcher
// mesh-ca` creates when given no CA, and what pods' init data pins as
// mesh.ca.
func NewMeshCAKey(trustDomain string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "c8s mesh CA " + trustDomain},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("mesh CA: create its certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// ParseMeshCA reads a mesh CA's certificate and key (PEM, as
// NewMeshCAKey writes them).
func ParseMeshCA(certPEM, keyPEM []byte) (*x509.Certificate, crypto.Signer, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("mesh CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("mesh CA: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, nil, errors.New("mesh CA: the certificate is not a CA certificate (basic constraints CA and key usage certSign)")
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("mesh CA: a %T key cannot sign", pair.PrivateKey)
	}
	return cert, signer, nil
}
