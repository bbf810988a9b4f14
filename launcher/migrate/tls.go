package migrate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// Files of a node's migration TLS identity, in statedir.MigrateTLS: the node's
// certificate and key (used as server and as client certificate) and the
// CA of its trust pool, which signs every member's certificate.
const (
	TLSCertFile = "cert.pem"
	TLSKeyFile  = "key.pem"
	TLSCAFile   = "ca.pem"
)

// LoadTLS reads the identity in dir and returns the server's config
// (client certificates required and verified against the pool CA) and the
// client's (the server verified against the pool CA, our certificate
// presented). Both require TLS 1.3.
func LoadTLS(dir string) (server, client *tls.Config, err error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, TLSCertFile), filepath.Join(dir, TLSKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("migrate: the node's TLS identity in %s: %w", dir, err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, TLSCAFile))
	if err != nil {
		return nil, nil, fmt.Errorf("migrate: the trust pool's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("migrate: %s holds no PEM certificate", filepath.Join(dir, TLSCAFile))
	}
	server = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	client = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
	}
	return server, client, nil
}

// NewTLSClient returns a client for a Server listening with mutual TLS on
// addr (HOST:PORT).
func NewTLSClient(addr string, cfg *tls.Config) (*Client, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("migrate: destination %q: want HOST:PORT: %w", addr, err)
	}
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	return newClient("tls://"+addr, func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{Config: cfg}
		return d.DialContext(ctx, "tcp", addr)
	}), nil
}

// Dial returns a client for a destination given as a unix socket path
// (optionally unix://PATH) or as tls://HOST:PORT, which is reached with
// mutual TLS with the node's identity (statedir.MigrateTLS) through the
// relay of the node's own server (relay.go; statedir.MigrateSocket).
//
// The client's QEMU migration stream uses the same identity (WithStream).
func Dial(dest string, cfg config.Config) (*Client, error) {
	identity := statedir.MigrateTLS(cfg.Runtime.StateDir)
	var c *Client
	switch {
	case strings.HasPrefix(dest, "tls://"):
		var err error
		if c, err = relayClient(statedir.MigrateSocket(cfg.Runtime.StateDir), strings.TrimPrefix(dest, "tls://")); err != nil {
			return nil, err
		}
	case strings.HasPrefix(dest, "unix://"):
		c = NewClient(strings.TrimPrefix(dest, "unix://"))
	case strings.HasPrefix(dest, "/"):
		c = NewClient(dest)
	default:
		return nil, errors.New("migrate: destination " + dest + ": want a unix socket path or tls://HOST:PORT")
	}
	return c.WithStream(identity, cfg.Migration.PlainLoopback), nil
}

// ListenTLS listens on addr for mutual-TLS API connections.
func ListenTLS(addr string, server *tls.Config) (net.Listener, error) {
	return tls.Listen("tcp", addr, server)
}
