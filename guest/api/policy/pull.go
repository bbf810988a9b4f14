package policy

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// Guest pull: a rule may name the image the guest pulls itself, through
// the pod's network, when the host offers no layer disks for the
// container (guest/pull, guest/agent pull.go):
//
//	[policy.containers.app]
//	pull = "registry.example:5000/app@sha256:0f6e…"   # digest-pinned, required
//	pull_auth = "kbs:///default/registry/app"          # optional: credentials from the key broker
//	pull_plain_http = false                            # optional: plain HTTP (test registries)
//	pull_ca = """-----BEGIN CERTIFICATE-----…"""       # optional: the registry's CA, the only root trusted
//
// The reference is the policy's, never the host's: the guest fetches the
// manifest by its digest and checks it, then the config and every layer
// blob by the digests the manifest names, while it streams them, and the
// layers' diff IDs against the config. The host controls the network and
// can serve anything; the digests are what protect. pull_auth names a
// resource of the pod's key broker (the [[kbs.secrets]] form) holding the
// registry credentials, never the host's. Plain HTTP tells whoever
// watches the network which image the pod runs and is for test
// registries: credentials are never sent over it.
//
// Over HTTPS the registry's certificate (and its token service's) is
// verified against pull_ca, measured with the policy, and nothing else;
// without pull_ca, against the public CA bundle of the sealed guest image
// (measured as part of it). Never the host's roots, never unverified.

// PullRef is a parsed, digest-pinned pull reference.
type PullRef struct {
	// Registry is the registry's host[:port] ("index.docker.io" for a
	// name without one).
	Registry string
	// Repository is the path in it ("library/debian").
	Repository string
	// Digest is "sha256:<64 hex>": the manifest's or index's.
	Digest string
}

// String is the reference as REGISTRY/REPOSITORY@DIGEST.
func (r PullRef) String() string { return r.Registry + "/" + r.Repository + "@" + r.Digest }

// Hex is the digest's hex.
func (r PullRef) Hex() string { return strings.TrimPrefix(r.Digest, "sha256:") }

// repoComponent is one path component of a repository (distribution's
// grammar, lower case).
// Compiled on first use: the agent's start does not pay for it.
var repoComponent = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$`)
})

// registryHost is a registry's host[:port].
var registryHost = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:.]+\])(?::[0-9]{1,5})?$`)
})

// ParsePullRef parses a digest-pinned reference NAME@sha256:<hex>, NAME
// as Docker reads it (a first component with a '.' or ':', or
// "localhost", is the registry; else Docker Hub). A tag
// (NAME:TAG, NAME:TAG@DIGEST) is refused.
func ParsePullRef(ref string) (PullRef, error) {
	name, dgst, ok := strings.Cut(ref, "@")
	if !ok {
		return PullRef{}, fmt.Errorf("%q is not pinned by digest: write NAME@sha256:<manifest digest> (`crane digest NAME:TAG` or `docker buildx imagetools inspect` prints it); a tag names whatever the registry serves", ref)
	}
	hexPart, ok := strings.CutPrefix(dgst, "sha256:")
	if !ok || !isHex(hexPart, 32) {
		return PullRef{}, fmt.Errorf("%q: digest %q is not sha256:<64 lower-case hex digits>", ref, dgst)
	}
	reg, repo := "index.docker.io", name
	if i := strings.IndexByte(name, '/'); i > 0 {
		first := name[:i]
		if strings.ContainsAny(first, ".:") || first == "localhost" || strings.HasPrefix(first, "[") {
			reg, repo = first, name[i+1:]
		}
	}
	if !registryHost().MatchString(reg) {
		return PullRef{}, fmt.Errorf("%q: registry %q is not HOST[:PORT]", ref, reg)
	}
	if reg == "docker.io" {
		reg = "index.docker.io"
	}
	if reg == "index.docker.io" && !strings.Contains(repo, "/") {
		repo = "library/" + repo
	}
	parts := strings.Split(repo, "/")
	last := parts[len(parts)-1]
	if strings.Contains(last, ":") {
		return PullRef{}, fmt.Errorf("%q names a tag (%s) as well as a digest: write NAME@sha256:… alone, so that nothing but the digest chooses the image", ref, last[strings.IndexByte(last, ':'):])
	}
	for _, p := range parts {
		if !repoComponent().MatchString(p) {
			return PullRef{}, fmt.Errorf("%q: repository component %q is not valid (lower-case letters, digits, '.', '_', '-')", ref, p)
		}
	}
	if len(repo) > 255 {
		return PullRef{}, fmt.Errorf("%q: repository name longer than 255 characters", ref)
	}
	return PullRef{Registry: reg, Repository: repo, Digest: dgst}, nil
}

// PullRef returns the rule's parsed pull reference, ok false when it has
// none. A validated policy's parses.
func (c *Container) PullRef() (PullRef, bool) {
	if c == nil || c.Pull == "" {
		return PullRef{}, false
	}
	r, err := ParsePullRef(c.Pull)
	return r, err == nil
}

// validatePull checks the guest-pull fields of the rule at key.
func validatePull(key string, p *Container) error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", key, field, fmt.Sprintf(format, a...)))
	}
	if p.Pull == "" {
		if p.PullAuth != "" {
			bad("pull_auth", "set without pull: credentials for which image?")
		}
		if p.PullPlainHTTP {
			bad("pull_plain_http", "set without pull")
		}
		if p.PullCA != "" {
			bad("pull_ca", "set without pull")
		}
		return errors.Join(errs...)
	}
	if p.PullCA != "" {
		if _, err := ParsePullCA(p.PullCA); err != nil {
			bad("pull_ca", "%v", err)
		}
		if p.PullPlainHTTP {
			bad("pull_ca", "set with pull_plain_http: plain HTTP verifies no certificate (serve the registry over HTTPS and drop pull_plain_http)")
		}
	}
	if _, err := ParsePullRef(p.Pull); err != nil {
		bad("pull", "%v", err)
	}
	if key == "policy.sandbox" {
		bad("pull", "the sandbox container's image cannot be pulled by the guest: the pod network it would be pulled through is the sandbox's own (pin its layers instead)")
	}
	if p.PullAuth != "" {
		if err := validateResource(p.PullAuth); err != nil {
			bad("pull_auth", "%v", err)
		}
		if p.PullPlainHTTP {
			bad("pull_auth", "credentials are never sent over plain HTTP: serve the registry over HTTPS, or pull anonymously")
		}
	}
	return errors.Join(errs...)
}

// ParsePullCA parses a rule's pull_ca: one or more PEM CERTIFICATE
// blocks, nothing else. They are the only roots the guest then verifies
// the registry's TLS certificate (and its token service's) against.
func ParsePullCA(s string) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := []byte(s)
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a PEM %q block: want only CERTIFICATE blocks (the registry's CA)", blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM CERTIFICATE: write the registry's CA certificate (-----BEGIN CERTIFICATE----- …)")
	}
	if strings.TrimSpace(string(rest)) != "" {
		return nil, errors.New("text after the last PEM certificate that is not a certificate")
	}
	return certs, nil
}

// validateResource checks a key broker resource path as [[kbs.secrets]]
// names one: kbs:///REPO/TYPE/TAG (a host part is ignored) or
// REPO/TYPE/TAG.
func validateResource(r string) error {
	p := r
	if rest, ok := strings.CutPrefix(p, "kbs://"); ok {
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return fmt.Errorf("%q: want kbs:///REPO/TYPE/TAG", r)
		}
		p = rest[i+1:]
	}
	parts := strings.Split(p, "/")
	if len(parts) != 3 {
		return fmt.Errorf("%q: want kbs:///REPO/TYPE/TAG (three parts)", r)
	}
	for _, part := range parts {
		if part == "" || part == "." || part == ".." || strings.ContainsAny(part, "?#%\\\x00") {
			return fmt.Errorf("%q: part %q is not allowed", r, part)
		}
	}
	return nil
}
