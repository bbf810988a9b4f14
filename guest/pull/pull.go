// Package pull pulls a digest-pinned container image into the guest and
// unpacks it into a directory of confidential storage (guest memory),
// trusting nothing it reads from the network until it has checked it
// against the pinned digest: the host controls the pod's network and can
// serve anything.
//
// Pull fetches the manifest by the pinned digest and checks that its bytes
// hash to it (an image index only if the pinned digest is one: then the
// manifest for the guest's platform, by the digest the index names,
// checked the same way), then the config by the manifest's digest, and
// each layer blob by its digest while it streams it: a blob whose bytes do
// not hash to their digest, or whose size is not the manifest's, aborts
// the pull. The uncompressed tar of each layer must hash to the diff ID
// the config lists for it. Layers are unpacked into one directory, bottom
// first, applying OCI whiteouts and opaque directories; no entry may
// escape the directory (every path is resolved inside it with
// openat2(RESOLVE_IN_ROOT)), and device nodes are not created.
//
// Each pull unpacks into a directory of its own, <dir>/<manifest
// hex>.partial-<random>, renamed to <dir>/<manifest hex> only once every
// check passed: a failed pull leaves nothing behind, and a directory of
// that name is an image that verified. Two pulls of one image (two rules
// that name it with other credentials or roots) never share what they
// write: the host carries both streams, and one still unpacking must not
// write into the tree the other verified.
//
// The registry protocol (ping, Basic and Bearer token authentication) is
// go-containerregistry's transport; the requests for manifests and blobs,
// and every check of what they return, are this package's. Plain HTTP is
// used only where Options.PlainHTTP says so, and never with credentials
// (GuardTransport). Over HTTPS the registry's certificate is verified
// against Options.Roots only (pinRoots): a certificate that does not
// chain to them ends the pull at the handshake, before any request, so
// no credentials reach it.
package pull

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// Bounds on what the registry may send before it is checked.
const (
	maxManifest = 4 << 20
	maxConfig   = 8 << 20
	maxLayers   = 127
)

// Media types of manifests and indexes (OCI's and Docker's).
const (
	mediaTypeDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
	mediaTypeDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
)

// Options say how to reach the registry.
type Options struct {
	// PlainHTTP talks HTTP to the registry instead of HTTPS.
	PlainHTTP bool
	// Auth is the registry's credentials; nil: anonymous.
	Auth *authn.AuthConfig
	// Roots are the CA certificates the registry's TLS certificate, and
	// its token service's, must chain to: the only roots the pull trusts
	// (the rule's pull_ca, or the guest image's bundle; never the host's).
	// Required unless PlainHTTP.
	Roots *x509.CertPool
	// Transport carries the requests (the guest's dials in the pod's
	// network namespace); nil: http.DefaultTransport. An *http.Transport:
	// the pull clones it and sets its TLS roots to Roots alone. It is
	// wrapped in GuardTransport.
	Transport http.RoundTripper
	// OS and Arch choose the manifest of an index; "": linux and the
	// guest's architecture.
	OS, Arch string
	// Progress, if set, is called as the layers stream in.
	Progress func(Progress)
}

// Progress is how far a pull is.
type Progress struct {
	// Done and Total are bytes of layer blobs (compressed, as the
	// manifest sizes them); Total is 0 until the manifest is read.
	Done, Total int64
}

// String is "312 of 900 MiB".
func (p Progress) String() string {
	if p.Total == 0 {
		return "reading the manifest"
	}
	return fmt.Sprintf("%d of %d MiB", p.Done>>20, (p.Total+(1<<20)-1)>>20)
}

// Image is a pulled image.
type Image struct {
	// Ref is the reference pulled.
	Ref policyapi.PullRef
	// Dir is its unpacked root file system.
	Dir string
	// Manifest is the digest of the platform's manifest (Ref.Digest,
	// unless that is an index).
	Manifest string
	// Config is the image's config.
	Config ocispec.Image
	// Bytes is the layer blobs' size in all.
	Bytes int64
}

// DigestError says that something the registry sent does not hash to the
// digest that names it: the registry, or whoever is on the network path,
// served other bytes.
type DigestError struct {
	// What is "manifest", "config" or "layer blob"; Digest the digest
	// expected, Got what the bytes hash to ("" when the size differed).
	What, Digest, Got string
	// Size problems: the size expected, the size read.
	Size, Read int64
}

func (e *DigestError) Error() string {
	if e.Got == "" {
		return fmt.Sprintf("%s %s: the registry sent %d bytes or more, the manifest says %d: refused (the network or the registry serves other content than the image pinned)", e.What, e.Digest, e.Read, e.Size)
	}
	return fmt.Sprintf("%s %s: the bytes received hash to %s: refused (the network or the registry serves other content than the image pinned)", e.What, e.Digest, e.Got)
}

// Pull pulls ref into dir/<manifest hex> and returns it. A directory of
// that name already there is an image an earlier pull verified and is
// returned as it is.
func Pull(ctx context.Context, ref policyapi.PullRef, dir string, o Options) (*Image, error) {
	if o.Auth != nil && o.PlainHTTP {
		return nil, fmt.Errorf("pull %s: credentials are never sent over plain HTTP", ref)
	}
	c, err := newClient(ctx, ref, o)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	img, err := c.pull(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	return img, nil
}

// client is one pull's registry connection.
type client struct {
	ref    policyapi.PullRef
	o      Options
	scheme string
	http   *http.Client
	done   atomic.Int64
	total  int64
}

func newClient(ctx context.Context, ref policyapi.PullRef, o Options) (*client, error) {
	var opts []name.Option
	scheme := "https"
	if o.PlainHTTP {
		opts, scheme = append(opts, name.Insecure), "http"
	}
	repo, err := name.NewRepository(ref.Registry+"/"+ref.Repository, opts...)
	if err != nil {
		return nil, err
	}
	base, err := pinRoots(o)
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", ref.Registry, err)
	}
	guarded := GuardTransport(base, o.PlainHTTP && o.Auth == nil)
	auth := authn.Anonymous
	if o.Auth != nil {
		auth = authn.FromConfig(*o.Auth)
	}
	rt, err := transport.NewWithContext(ctx, repo.Registry, auth, guarded, []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", ref.Registry, err)
	}
	return &client{ref: ref, o: o, scheme: scheme, http: &http.Client{Transport: rt}}, nil
}

// pinRoots returns o's transport with its TLS roots set to o.Roots and
// nothing else: whatever the transport trusted before (the system's
// roots, a test server's certificate) is dropped, and verification is
// always on. Over plain HTTP the transport is as given, TLS is then never
// used (GuardTransport).
func pinRoots(o Options) (http.RoundTripper, error) {
	base := o.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	if o.PlainHTTP {
		return base, nil
	}
	if o.Roots == nil {
		return nil, errors.New("no CA certificate to verify the registry's TLS certificate against: name the registry's CA in the rule's pull_ca")
	}
	t, ok := base.(*http.Transport)
	if !ok {
		return nil, fmt.Errorf("transport %T: the pull pins its TLS roots on an *http.Transport only", base)
	}
	t = t.Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: o.Roots, MinVersion: tls.VersionTLS12}
	return t, nil
}

// GuardTransport refuses every plain-HTTP request unless plainHTTP: the
// registry's token service, or a redirect, cannot move a pull (and the
// credentials it carries) off TLS.
func GuardTransport(rt http.RoundTripper, plainHTTP bool) http.RoundTripper {
	return guard{rt: rt, plainHTTP: plainHTTP}
}

type guard struct {
	rt        http.RoundTripper
	plainHTTP bool
}

func (g guard) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" && !(g.plainHTTP && r.URL.Scheme == "http") {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, fmt.Errorf("%s %s: refused: the pull talks HTTPS only (plain HTTP needs pull_plain_http in the rule, and is never used with credentials)", r.Method, r.URL.Redacted())
	}
	return g.rt.RoundTrip(r)
}

func (c *client) url(kind, dgst string) string {
	return fmt.Sprintf("%s://%s/v2/%s/%s/%s", c.scheme, c.ref.Registry, c.ref.Repository, kind, dgst)
}

// get fetches a manifest or blob.
func (c *client) get(ctx context.Context, kind, dgst string, accept []string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(kind, dgst), nil)
	if err != nil {
		return nil, err
	}
	for _, a := range accept {
		req.Header.Add("Accept", a)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s: %s", req.URL.Redacted(), resp.Status, strings.TrimSpace(string(body)))
	}
	return resp, nil
}

// fetchSmall fetches a manifest or config of at most limit bytes and
// checks that it hashes to dgst.
func (c *client) fetchSmall(ctx context.Context, what, kind, dgst string, limit int64, accept []string) ([]byte, string, error) {
	resp, err := c.get(ctx, kind, dgst, accept)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, "", fmt.Errorf("%s %s: %w", what, dgst, err)
	}
	if int64(len(b)) > limit {
		return nil, "", fmt.Errorf("%s %s: larger than %d bytes: refused", what, dgst, limit)
	}
	if got := sha256Digest(b); got != dgst {
		return nil, "", &DigestError{What: what, Digest: dgst, Got: got}
	}
	return b, resp.Header.Get("Content-Type"), nil
}

func sha256Digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// manifest reads the pinned manifest, through the index if the pinned
// digest is one.
func (c *client) manifest(ctx context.Context) (ocispec.Manifest, string, error) {
	accept := []string{ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex, mediaTypeDockerManifest, mediaTypeDockerList}
	b, _, err := c.fetchSmall(ctx, "manifest", "manifests", c.ref.Digest, maxManifest, accept)
	if err != nil {
		return ocispec.Manifest{}, "", err
	}
	var probe struct {
		MediaType string            `json:"mediaType"`
		Manifests []json.RawMessage `json:"manifests"`
		Config    json.RawMessage   `json:"config"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return ocispec.Manifest{}, "", fmt.Errorf("manifest %s: %w", c.ref.Digest, err)
	}
	dgst := c.ref.Digest
	if probe.MediaType == ocispec.MediaTypeImageIndex || probe.MediaType == mediaTypeDockerList || (probe.MediaType == "" && probe.Manifests != nil && probe.Config == nil) {
		var idx ocispec.Index
		if err := json.Unmarshal(b, &idx); err != nil {
			return ocispec.Manifest{}, "", fmt.Errorf("index %s: %w", c.ref.Digest, err)
		}
		d, err := c.choose(idx)
		if err != nil {
			return ocispec.Manifest{}, "", err
		}
		dgst = d
		if b, _, err = c.fetchSmall(ctx, "manifest", "manifests", dgst, maxManifest, accept[:1:1]); err != nil {
			return ocispec.Manifest{}, "", err
		}
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return ocispec.Manifest{}, "", fmt.Errorf("manifest %s: %w", dgst, err)
	}
	if m.MediaType != "" && m.MediaType != ocispec.MediaTypeImageManifest && m.MediaType != mediaTypeDockerManifest {
		return ocispec.Manifest{}, "", fmt.Errorf("manifest %s: media type %q is not an image manifest", dgst, m.MediaType)
	}
	if len(m.Layers) == 0 || len(m.Layers) > maxLayers {
		return ocispec.Manifest{}, "", fmt.Errorf("manifest %s: %d layers (an image has 1 to %d)", dgst, len(m.Layers), maxLayers)
	}
	return m, dgst, nil
}

// choose picks the guest's platform's manifest of an index.
func (c *client) choose(idx ocispec.Index) (string, error) {
	osName, arch := c.o.OS, c.o.Arch
	if osName == "" {
		osName = "linux"
	}
	if arch == "" {
		arch = runtime.GOARCH
	}
	var seen []string
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			continue
		}
		seen = append(seen, d.Platform.OS+"/"+d.Platform.Architecture)
		if d.Platform.OS == osName && d.Platform.Architecture == arch && validDigest(d.Digest.String()) {
			return d.Digest.String(), nil
		}
	}
	return "", fmt.Errorf("index %s has no manifest for %s/%s (it has %s)", c.ref.Digest, osName, arch, strings.Join(seen, ", "))
}

func validDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

func (c *client) pull(ctx context.Context, dir string) (*Image, error) {
	c.report()
	m, mdgst, err := c.manifest(ctx)
	if err != nil {
		return nil, err
	}
	if !validDigest(m.Config.Digest.String()) {
		return nil, fmt.Errorf("manifest %s: config digest %q is not sha256", mdgst, m.Config.Digest)
	}
	cb, _, err := c.fetchSmall(ctx, "config", "blobs", m.Config.Digest.String(), maxConfig, nil)
	if err != nil {
		return nil, err
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return nil, fmt.Errorf("config %s: %w", m.Config.Digest, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return nil, fmt.Errorf("config %s lists %d diff IDs for the manifest's %d layers", m.Config.Digest, len(cfg.RootFS.DiffIDs), len(m.Layers))
	}
	for i, l := range m.Layers {
		if !validDigest(l.Digest.String()) || l.Size < 0 {
			return nil, fmt.Errorf("manifest %s: layers[%d]: digest %q, size %d: not a sha256 blob", mdgst, i, l.Digest, l.Size)
		}
		c.total += l.Size
	}
	final := filepath.Join(dir, strings.TrimPrefix(mdgst, "sha256:"))
	img := &Image{Ref: c.ref, Dir: final, Manifest: mdgst, Config: cfg, Bytes: c.total}
	if st, err := os.Stat(final); err == nil && st.IsDir() {
		return img, nil
	}
	partial, err := os.MkdirTemp(dir, filepath.Base(final)+".partial-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(partial, 0o755); err != nil { // MkdirTemp's is 0700
		_ = os.Remove(partial)
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(partial)
		}
	}()
	c.report()
	for i, l := range m.Layers {
		if err := c.layer(ctx, partial, l, cfg.RootFS.DiffIDs[i].String()); err != nil {
			return nil, fmt.Errorf("layers[%d]: %w", i, err)
		}
	}
	if err := os.Rename(partial, final); err != nil {
		if st, serr := os.Stat(final); serr == nil && st.IsDir() {
			return img, nil // another pull of it verified first; ours goes
		}
		return nil, err
	}
	ok = true
	return img, nil
}

func (c *client) report() {
	if c.o.Progress != nil {
		c.o.Progress(Progress{Done: c.done.Load(), Total: c.total})
	}
}

// layer streams one layer blob, checking its digest and size as it reads
// and its diff ID at its end, and unpacks it into root.
func (c *client) layer(ctx context.Context, root string, l ocispec.Descriptor, diffID string) error {
	dgst := l.Digest.String()
	if !validDigest(diffID) {
		return fmt.Errorf("layer blob %s: diff ID %q is not sha256", dgst, diffID)
	}
	resp, err := c.get(ctx, "blobs", dgst, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	v := &verifier{r: io.LimitReader(resp.Body, l.Size+1), h: sha256.New(), c: c}
	tarStream, err := decompress(v, l.MediaType)
	if err != nil {
		return fmt.Errorf("layer blob %s: %w", dgst, err)
	}
	defer tarStream.Close()
	dh := sha256.New()
	uerr := unpack(io.TeeReader(tarStream, dh), root)
	// Read what the tar did not (padding, the compressor's trailer), so
	// that the blob's digest covers all of it.
	if uerr == nil {
		_, uerr = io.Copy(dh, tarStream)
	}
	_, _ = io.Copy(io.Discard, v)
	// The blob's digest first: a blob that does not verify explains
	// whatever else went wrong with it.
	if v.n != l.Size {
		return &DigestError{What: "layer blob", Digest: dgst, Size: l.Size, Read: v.n}
	}
	if got := "sha256:" + hex.EncodeToString(v.h.Sum(nil)); got != dgst {
		return &DigestError{What: "layer blob", Digest: dgst, Got: got}
	}
	if uerr != nil {
		return fmt.Errorf("layer blob %s: %w", dgst, uerr)
	}
	if got := "sha256:" + hex.EncodeToString(dh.Sum(nil)); got != diffID {
		return fmt.Errorf("layer blob %s: its tar hashes to %s, the config's diff ID is %s: refused", dgst, got, diffID)
	}
	return nil
}

// verifier hashes and counts a blob as it is read.
type verifier struct {
	r io.Reader
	h hash.Hash
	n int64
	c *client
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	if n > 0 {
		v.h.Write(p[:n])
		v.n += int64(n)
		v.c.done.Add(int64(n))
		v.c.report()
	}
	return n, err
}
