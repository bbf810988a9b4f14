package initdata

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"
)

// KBS names the key broker a pod gets its secrets from, and the secrets.
// It is part of the measured document: the host cannot point the agent at
// another broker, or swap the broker's certificate, without changing
// HOST_DATA.
//
//	[kbs]
//	url = "https://kbs.example:8080"
//	cert = """
//	-----BEGIN CERTIFICATE-----
//	...
//	-----END CERTIFICATE-----"""
//
//	[[kbs.secrets]]
//	resource = "kbs:///default/key/db-password"
//	path = "/run/secrets/db-password"
type KBS struct {
	// URL is the broker's base URL (https only).
	URL string `toml:"url"`
	// Cert is the PEM certificate the broker's TLS chain must lead to: the
	// only root the agent trusts for it.
	Cert string `toml:"cert"`
	// Secrets are the resources to fetch and where containers see them.
	Secrets []Secret `toml:"secrets"`
}

// Secret is one broker resource and its path inside the containers.
type Secret struct {
	// Resource is kbs:///REPO/TYPE/TAG or REPO/TYPE/TAG.
	Resource string `toml:"resource"`
	// Path is the absolute file path at which containers read it.
	Path string `toml:"path"`
}

// ResourcePath returns the secret's REPO/TYPE/TAG.
func (s Secret) ResourcePath() (string, error) {
	r := s.Resource
	if rest, ok := strings.CutPrefix(r, "kbs://"); ok {
		// kbs://HOST/REPO/TYPE/TAG: the host part, if any, is ignored
		// (the broker is the one the init data names).
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return "", fmt.Errorf("init data: resource %q: want kbs:///REPO/TYPE/TAG", s.Resource)
		}
		r = rest[i+1:]
	}
	parts := strings.Split(r, "/")
	if len(parts) != 3 {
		return "", fmt.Errorf("init data: resource %q: want REPO/TYPE/TAG (three parts)", s.Resource)
	}
	for _, p := range parts {
		if p == "" || p == "." || p == ".." || strings.ContainsAny(p, "?#%\\\x00") {
			return "", fmt.Errorf("init data: resource %q: part %q is not allowed", s.Resource, p)
		}
	}
	return r, nil
}

// Address is the broker's host:port (443 when the URL names none).
func (k *KBS) Address() (string, error) {
	u, err := url.Parse(k.URL)
	if err != nil {
		return "", fmt.Errorf("init data: kbs.url: %w", err)
	}
	if u.Scheme != "https" || u.Hostname() == "" {
		return "", fmt.Errorf("init data: kbs.url %q: want https://HOST[:PORT]", k.URL)
	}
	if u.Port() == "" {
		return u.Hostname() + ":443", nil
	}
	return u.Host, nil
}

// CertPool returns a pool holding only the broker certificate.
func (k *KBS) CertPool() (*x509.CertPool, error) {
	blk, _ := pem.Decode([]byte(k.Cert))
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("init data: kbs.cert is not a PEM CERTIFICATE")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("init data: kbs.cert: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return pool, nil
}

// validate checks the section: URL, certificate, resources and paths.
func (k *KBS) validate() error {
	if k.URL == "" {
		if len(k.Secrets) > 0 || k.Cert != "" {
			return errors.New("init data: kbs.url is required when kbs has secrets or a cert")
		}
		return nil
	}
	if _, err := k.Address(); err != nil {
		return err
	}
	if _, err := k.CertPool(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, s := range k.Secrets {
		if _, err := s.ResourcePath(); err != nil {
			return err
		}
		p := path.Clean(s.Path)
		if !path.IsAbs(s.Path) || p == "/" || p != s.Path {
			return fmt.Errorf("init data: secret %s: path %q must be a clean absolute file path", s.Resource, s.Path)
		}
		if seen[p] {
			return fmt.Errorf("init data: two secrets at path %s", p)
		}
		seen[p] = true
	}
	return nil
}
