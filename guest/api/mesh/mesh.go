// Package mesh is the contract of c8s's attested mesh between the pod and
// the owner's mesh CA (launcher/broker MeshCA, served by `c8s-launcher
// mesh-ca`), and between pods.
//
// A pod whose measured init data has a [mesh] section (guest/api/initdata
// Mesh) makes a key in guest memory and asks the CA, over the pod network
// and TLS pinned to the CA's certificate in that section, for a workload
// certificate:
//
//	POST /c8s/mesh/v1/challenge    {}                  → Challenge{nonce}
//	POST /c8s/mesh/v1/certificate  CertificateRequest  → CertificateResponse
//
// The request carries the pod's TEE evidence, whose REPORT_DATA is
// reportdata.MeshKey(SPKI of the CSR's key, nonce), the init data document
// whose digest the evidence shows (HOST_DATA or MRCONFIGID), and a CSR
// signed with the key. The CA verifies the evidence against the owner's
// reference values and resource policy, as the key broker does, and issues
// a short-lived certificate whose URI SAN is the workload's SPIFFE ID
// (IdentityURI) and which carries the init data digest, the TEE and the
// launch measurement in c8s-private extensions (OIDInitDataDigest, ...).
//
// Peers authenticate each other by that chain and identity only, never by
// IP address: mutual TLS 1.3, both certificates from the mesh CA named in
// each pod's measured init data.
package mesh

import (
	"crypto/x509"
	"encoding/asn1"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// The CA's endpoints.
const (
	ChallengePath   = "/c8s/mesh/v1/challenge"
	CertificatePath = "/c8s/mesh/v1/certificate"
)

// NonceSize is the size of the CA's nonce.
const NonceSize = 32

// Challenge is the CA's answer to ChallengePath: a fresh nonce, which one
// CertificateRequest may answer, once, before it expires.
type Challenge struct {
	Nonce []byte `json:"nonce"`
}

// CertificateRequest asks for a workload certificate.
type CertificateRequest struct {
	// Nonce is the Challenge's.
	Nonce []byte `json:"nonce"`
	// TEE is the KBS protocol name of the evidence: "snp" (the sim TEE's
	// too) or "tdx".
	TEE string `json:"tee"`
	// Evidence is the TEE evidence in the encoding Trustee's verifier for
	// TEE reads, as the KBS protocol's primary evidence (guest/api/kbs):
	// its REPORT_DATA is reportdata.MeshKey(CSR's SPKI, Nonce).
	Evidence json.RawMessage `json:"evidence"`
	// InitData is the pod's init data document (TOML), whose digest the
	// evidence carries.
	InitData string `json:"init_data"`
	// CSR is a PKCS #10 request (DER) signed with the workload key.
	CSR []byte `json:"csr"`
}

// CertificateResponse is an issued certificate.
type CertificateResponse struct {
	// Certificate is the workload certificate, PEM.
	Certificate string `json:"certificate"`
	// CA is the mesh CA's certificate, PEM, which peers' chains lead to.
	CA string `json:"ca"`
}

// Error is a refusal: its HTTP status says which (400 a malformed
// request, 401 evidence that does not verify, 403 a workload the owner's
// policy gives no such identity).
type Error struct {
	Detail string `json:"detail"`
}

// The c8s-private extensions of a workload certificate. c8s holds no
// enterprise number, so they sit under 1.3.6.1.3.8 (IANA's experimental
// arc, 1.3.6.1.3; .8 picked by c8s): unregistered, private to c8s and
// never marked critical, so that any TLS stack accepts the certificate
// and only c8s-aware peers read them. Replace the arc with a registered
// one before relying on it across organisations.
var (
	OIDArc = asn1.ObjectIdentifier{1, 3, 6, 1, 3, 8}
	// OIDInitDataDigest is an OCTET STRING: the pod's init data digest as
	// its evidence showed it (SNP HOST_DATA, 32 bytes; TDX MRCONFIGID, 48).
	OIDInitDataDigest = asn1.ObjectIdentifier{1, 3, 6, 1, 3, 8, 1}
	// OIDTEE is a UTF8String: "snp", "tdx" or "sim".
	OIDTEE = asn1.ObjectIdentifier{1, 3, 6, 1, 3, 8, 2}
	// OIDLaunchMeasurement is an OCTET STRING: the SNP launch digest or
	// the TDX MRTD.
	OIDLaunchMeasurement = asn1.ObjectIdentifier{1, 3, 6, 1, 3, 8, 3}
)

// SPIFFEScheme is the scheme of workload identities.
const SPIFFEScheme = "spiffe"

// IdentityURI is the SPIFFE ID of a Kubernetes service account:
// spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT.
func IdentityURI(trustDomain, namespace, serviceAccount string) string {
	return fmt.Sprintf("%s://%s/ns/%s/sa/%s", SPIFFEScheme, trustDomain, namespace, serviceAccount)
}

// CheckIdentity reports whether id is a SPIFFE ID c8s issues: spiffe://
// TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT, each part non-empty,
// lower-case letters, digits, '-', '.' and '_' only.
func CheckIdentity(id string) error {
	u, err := url.Parse(id)
	if err != nil {
		return fmt.Errorf("identity %q: %w", id, err)
	}
	if u.Scheme != SPIFFEScheme || u.Host == "" || u.User != nil || u.Port() != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return fmt.Errorf("identity %q: want spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT", id)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" {
		return fmt.Errorf("identity %q: want spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT", id)
	}
	for _, p := range append([]string{u.Host}, parts[1], parts[3]) {
		if !validName(p) {
			return fmt.Errorf("identity %q: %q is not a name (lower-case letters, digits, '-', '.', '_')", id, p)
		}
	}
	return nil
}

func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return false
		}
	}
	return true
}

// Identity returns the workload identity of a mesh certificate: its one
// spiffe:// URI SAN. A certificate with none, or several, has none.
func Identity(c *x509.Certificate) (string, error) {
	var ids []string
	for _, u := range c.URIs {
		if u.Scheme == SPIFFEScheme {
			ids = append(ids, u.String())
		}
	}
	switch len(ids) {
	case 0:
		return "", errors.New("the certificate has no spiffe:// URI SAN: it is not a mesh workload certificate")
	case 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("the certificate has %d spiffe:// URI SANs: a workload has one identity", len(ids))
}

// Claims are what the c8s-private extensions of a workload certificate
// say about the pod it was issued to.
type Claims struct {
	InitDataDigest []byte
	TEE            string
	Measurement    []byte
}

// ClaimsOf reads the c8s-private extensions of c.
func ClaimsOf(c *x509.Certificate) (Claims, error) {
	var cl Claims
	for _, e := range c.Extensions {
		var err error
		switch {
		case e.Id.Equal(OIDInitDataDigest):
			_, err = asn1.Unmarshal(e.Value, &cl.InitDataDigest)
		case e.Id.Equal(OIDTEE):
			_, err = asn1.UnmarshalWithParams(e.Value, &cl.TEE, "utf8")
		case e.Id.Equal(OIDLaunchMeasurement):
			_, err = asn1.Unmarshal(e.Value, &cl.Measurement)
		}
		if err != nil {
			return Claims{}, fmt.Errorf("extension %s: %w", e.Id, err)
		}
	}
	if len(cl.InitDataDigest) == 0 {
		return Claims{}, fmt.Errorf("the certificate has no init data digest extension (%s): it is not a c8s workload certificate", OIDInitDataDigest)
	}
	return cl, nil
}

// The files a meshed pod's containers read, in Dir (a tmpfs in guest
// memory).
const (
	Dir      = "/run/c8s/mesh"
	CertFile = "cert.pem"
	KeyFile  = "key.pem"
	CAFile   = "ca.pem"
)
