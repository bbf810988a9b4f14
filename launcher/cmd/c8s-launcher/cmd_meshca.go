package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/c8s-dev/c8s/launcher/broker"
)

func init() {
	register("mesh-ca", "serve the owner's mesh CA: workload certificates for the attested mesh, issued only to pods whose evidence verifies and whose identity the owner's resource policy gives them", runMeshCA)
}

// meshCAFlags are the mesh-ca subcommand's settings beyond the
// verification flags it shares with kbs.
type meshCAFlags struct {
	caCert, caKey string
	lifetime      time.Duration
}

func runMeshCA(ctx context.Context, args []string, stdout io.Writer) error {
	var o kbsFlags
	var m meshCAFlags
	fs := newFlags("mesh-ca")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8444", "address to serve HTTPS on (the pods reach it over the pod network)")
	fs.StringVar(&o.certFile, "cert", "", "TLS certificate (PEM) of the endpoint, which pods' init data pins as mesh.cert; with --key. Both missing files: a self-signed pair for --hosts is created")
	fs.StringVar(&o.keyFile, "key", "", "TLS key (PEM)")
	fs.StringVar(&o.hosts, "hosts", "127.0.0.1", "comma-separated names and addresses of a created TLS certificate")
	fs.StringVar(&m.caCert, "ca-cert", "", "the mesh CA's certificate (PEM), which pods' init data pins as mesh.ca; with --ca-key. Both missing files: a new CA is created for the policy's trust domain")
	fs.StringVar(&m.caKey, "ca-key", "", "the mesh CA's key (PEM)")
	fs.DurationVar(&m.lifetime, "lifetime", broker.DefaultMeshLifetime, "how long a workload certificate is valid; pods renew at two thirds of it through a fresh attestation")
	o.registerVerification(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.certFile == "" || o.keyFile == "" || m.caCert == "" || m.caKey == "" {
		return errors.New("--cert, --key, --ca-cert and --ca-key are required")
	}
	if o.resourcePolicy == "" {
		return errors.New("--resource-policy is required: its [mesh] section says which workload holds which identity")
	}
	if m.lifetime < 10*time.Second {
		return fmt.Errorf("--lifetime %v: at least 10s (pods renew at two thirds of it)", m.lifetime)
	}
	ca, tee, err := newMeshCA(o, m, stdout)
	if err != nil {
		return err
	}
	return o.serveHTTPS(ctx, ca, stdout, func(addr net.Addr) string {
		return fmt.Sprintf("serving the mesh CA on https://%s (tee %s, trust domain %s, certificates valid %v)", addr, tee, ca.trustDomain, m.lifetime)
	})
}

// meshCA is the CA and its trust domain, for the banner.
type meshCA struct {
	*broker.MeshCA
	trustDomain string
}

// newMeshCA builds the CA o and m describe: the verification of the kbs
// command (owner mode: the owner's files only), the resource policy's
// [mesh] section, and the CA's key, created when both files are missing.
func newMeshCA(o kbsFlags, m meshCAFlags, stdout io.Writer) (*meshCA, string, error) {
	b, tee, err := newKBSBroker(o, stdout)
	if err != nil {
		return nil, "", err
	}
	if b.ResourcePolicy == nil || b.ResourcePolicy.Mesh == nil {
		return nil, "", fmt.Errorf("--resource-policy %s has no [mesh] section: give trust_domain and the [[mesh.identities]] the CA issues", o.resourcePolicy)
	}
	td := b.ResourcePolicy.Mesh.TrustDomain
	certPEM, keyPEM, err := ensureMeshCA(m.caCert, m.caKey, td, stdout)
	if err != nil {
		return nil, "", err
	}
	cert, key, err := broker.ParseMeshCA(certPEM, keyPEM)
	if err != nil {
		return nil, "", err
	}
	ca := broker.NewMeshCA(b, cert, key)
	ca.Lifetime = m.lifetime
	return &meshCA{ca, td}, tee, nil
}

// ensureMeshCA reads the CA's files, or creates both when both are
// missing.
func ensureMeshCA(certFile, keyFile, trustDomain string, stdout io.Writer) (certPEM, keyPEM []byte, err error) {
	certPEM, cerr := os.ReadFile(certFile)
	keyPEM, kerr := os.ReadFile(keyFile)
	switch {
	case cerr == nil && kerr == nil:
		return certPEM, keyPEM, nil
	case !errors.Is(cerr, os.ErrNotExist) || !errors.Is(kerr, os.ErrNotExist):
		return nil, nil, fmt.Errorf("--ca-cert %s and --ca-key %s: give both existing files, or two missing ones to create", certFile, keyFile)
	}
	if certPEM, keyPEM, err = broker.NewMeshCAKey(trustDomain, 10*365*24*time.Hour); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(stdout, "created a mesh CA %s for trust domain %s: put it in the pods' init data as mesh.ca\n", certFile, trustDomain)
	return certPEM, keyPEM, nil
}
