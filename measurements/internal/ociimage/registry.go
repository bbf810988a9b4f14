package ociimage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// RegistryOptions say how to reach a registry.
type RegistryOptions struct {
	// Insecure allows plain http to any registry. Without it, https is
	// used, except for a registry on the loopback interface (localhost,
	// 127.0.0.0/8, ::1), which is spoken to in plain http as Docker does.
	Insecure bool
	// Client is the HTTP client (http.DefaultClient if nil).
	Client *http.Client
}

// Reference is an image reference split into its parts.
type Reference struct {
	// Registry is the registry's host[:port] (registry-1.docker.io for
	// Docker Hub).
	Registry string
	// Repository is the repository's path (library/busybox).
	Repository string
	// Tag or Digest names the image; Digest wins when both are given.
	Tag    string
	Digest digest.Digest
}

var (
	repoRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$`)
	tagRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// ParseReference reads a reference as Docker does: [HOST[:PORT]/]PATH
// [:TAG][@sha256:DIGEST]; a first component with a dot or a port, or
// localhost, is a registry, else the image is on Docker Hub (library/ for
// a one-component path); no tag and no digest is :latest.
func ParseReference(ref string) (Reference, error) {
	var r Reference
	name := ref
	if i := strings.Index(name, "@"); i >= 0 {
		r.Digest = digest.Digest(name[i+1:])
		if err := r.Digest.Validate(); err != nil {
			return r, fmt.Errorf("reference %q: digest: %w", ref, err)
		}
		name = name[:i]
	}
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		r.Tag, name = name[i+1:], name[:i]
		if !tagRE.MatchString(r.Tag) {
			return r, fmt.Errorf("reference %q: %q is not a tag", ref, r.Tag)
		}
	}
	first, rest, found := strings.Cut(name, "/")
	if found && (strings.ContainsAny(first, ".:") || first == "localhost") {
		r.Registry, r.Repository = first, rest
	} else {
		r.Registry, r.Repository = "docker.io", name
	}
	if r.Registry == "docker.io" || r.Registry == "index.docker.io" {
		r.Registry = "registry-1.docker.io"
		if !strings.Contains(r.Repository, "/") {
			r.Repository = "library/" + r.Repository
		}
	}
	if !repoRE.MatchString(r.Repository) {
		return r, fmt.Errorf("reference %q: %q is not a repository name", ref, r.Repository)
	}
	if r.Tag == "" && r.Digest == "" {
		r.Tag = "latest"
	}
	return r, nil
}

// loopback reports whether host[:port] is on the loopback interface.
func loopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// OpenRegistry reads the image ref from its registry (the OCI
// distribution API, anonymous pull: a bearer token when the registry asks
// for one). A tag is resolved to the manifest the registry serves now; a
// digest must be what the registry serves. Every blob is checked against
// its digest as it is read.
func OpenRegistry(ctx context.Context, ref string, o RegistryOptions) (*Image, error) {
	r, err := ParseReference(ref)
	if err != nil {
		return nil, err
	}
	scheme := "https"
	if o.Insecure || loopback(r.Registry) {
		scheme = "http"
	}
	c := &registry{base: scheme + "://" + r.Registry + "/v2/" + r.Repository, repo: r.Repository, client: o.Client}
	if c.client == nil {
		c.client = http.DefaultClient
	}
	name := r.Digest.String()
	if name == "" {
		name = r.Tag
	}
	data, mediaType, err := c.manifest(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	got := digest.FromBytes(data)
	if r.Digest != "" && got != r.Digest {
		return nil, fmt.Errorf("%s: the registry's manifest has digest %s, not the one the reference pins", ref, got)
	}
	if mt := sniffMediaType(data); mt != "" {
		mediaType = mt
	}
	if !isIndex(mediaType) && !isManifest(mediaType) {
		return nil, fmt.Errorf("%s: the registry serves %q, neither an image index nor a manifest", ref, mediaType)
	}
	c.cache(got, data)
	img, err := fromDescriptor(ctx, c, ref, ocispec.Descriptor{MediaType: mediaType, Digest: got, Size: int64(len(data))})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return img, nil
}

// registry is one repository of a registry.
type registry struct {
	base, repo string
	client     *http.Client
	mu         sync.Mutex
	token      string
	// first is the manifest read to resolve the reference, served again
	// from memory.
	first struct {
		d    digest.Digest
		data []byte
	}
}

func (c *registry) cache(d digest.Digest, data []byte) {
	c.first.d, c.first.data = d, data
}

// manifestAccept lists the manifest media types c8s reads.
var manifestAccept = strings.Join([]string{ocispec.MediaTypeImageIndex, ocispec.MediaTypeImageManifest, MediaTypeDockerList, MediaTypeDockerManifest}, ", ")

func (c *registry) manifest(ctx context.Context, name string) ([]byte, string, error) {
	resp, err := c.get(ctx, "/manifests/"+name, manifestAccept)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJSON+1))
	if err != nil {
		return nil, "", err
	}
	if len(data) > maxJSON {
		return nil, "", fmt.Errorf("manifest %s is larger than %d bytes", name, maxJSON)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return data, mt, nil
}

func (c *registry) blob(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if desc.Digest == c.first.d {
		return io.NopCloser(bytes.NewReader(c.first.data)), nil
	}
	p, accept := "/blobs/"+desc.Digest.String(), ""
	if isIndex(desc.MediaType) || isManifest(desc.MediaType) {
		p, accept = "/manifests/"+desc.Digest.String(), manifestAccept
	}
	resp, err := c.get(ctx, p, accept)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// get fetches base+p, answering one bearer-token challenge.
func (c *registry) get(ctx context.Context, p, accept string) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+p, nil)
		if err != nil {
			return nil, err
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		c.mu.Lock()
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		c.mu.Unlock()
		resp, err := c.client.Do(req)
		if err != nil {
			return nil, err
		}
		switch {
		case resp.StatusCode == http.StatusOK:
			return resp, nil
		case resp.StatusCode == http.StatusUnauthorized && attempt == 0:
			challenge := resp.Header.Get("WWW-Authenticate")
			resp.Body.Close()
			if err := c.authorize(ctx, challenge); err != nil {
				return nil, fmt.Errorf("%s: %w", req.URL, err)
			}
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s: %s", req.URL, resp.Status, strings.TrimSpace(string(body)))
	}
}

var challengeParamRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// authorize gets an anonymous pull token as a Bearer challenge asks.
func (c *registry) authorize(ctx context.Context, challenge string) error {
	scheme, params, _ := strings.Cut(challenge, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return fmt.Errorf("the registry wants credentials (%q): c8s-measure pulls anonymously; copy the image into an OCI layout (skopeo copy docker://REF oci:DIR) and give that", challenge)
	}
	p := map[string]string{}
	for _, m := range challengeParamRE.FindAllStringSubmatch(params, -1) {
		p[m[1]] = m[2]
	}
	realm, err := url.Parse(p["realm"])
	if err != nil || realm.Scheme == "" {
		return fmt.Errorf("the registry's token challenge has no realm: %q", challenge)
	}
	q := realm.Query()
	if s := p["service"]; s != "" {
		q.Set("service", s)
	}
	scope := p["scope"]
	if scope == "" {
		scope = "repository:" + c.repo + ":pull"
	}
	q.Set("scope", scope)
	realm.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, realm.String(), nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("token %s: %s (the image may need credentials: copy it into an OCI layout with skopeo and give that)", realm.Host, resp.Status)
	}
	var tok struct {
		Token       string `json:"token"`
		AccessToken string `json:"access_token"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&tok); err != nil {
		return fmt.Errorf("token %s: %w", realm.Host, err)
	}
	t := tok.Token
	if t == "" {
		t = tok.AccessToken
	}
	if t == "" {
		return fmt.Errorf("token %s: no token in the answer", realm.Host)
	}
	c.mu.Lock()
	c.token = t
	c.mu.Unlock()
	return nil
}
