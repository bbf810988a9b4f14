package pull

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
}

func tarOf(t *testing.T, es []entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Uid: e.uid, Gid: e.uid}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return b.Bytes()
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	z := gzip.NewWriter(&out)
	z.Write(b)
	z.Close()
	return out.Bytes()
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// testImage is an image pushed to a test registry.
type testImage struct {
	layers, tars [][]byte // blobs (gzip) and their tars
	config       []byte
	manifest     []byte
}

func (im *testImage) layerDigest(i int) string { return digestOf(im.layers[i]) }

// newImage builds an image of the layers' tars; diffIDs overrides the
// config's.
func newImage(t *testing.T, tars [][]byte, diffIDs []string) *testImage {
	im := &testImage{tars: tars}
	var cfg ocispec.Image
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.RootFS.Type = "layers"
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest}
	m.SchemaVersion = 2
	for i, tb := range tars {
		blob := gz(tb)
		im.layers = append(im.layers, blob)
		d := digestOf(tb)
		if diffIDs != nil {
			d = diffIDs[i]
		}
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, digestDigest(d))
		m.Layers = append(m.Layers, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digestDigest(digestOf(blob)), Size: int64(len(blob))})
	}
	im.config, _ = json.Marshal(cfg)
	m.Config = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digestDigest(digestOf(im.config)), Size: int64(len(im.config))}
	im.manifest, _ = json.Marshal(m)
	return im
}

// testRegistry is go-containerregistry's in-memory registry, behind a
// handler the test may change.
type testRegistry struct {
	srv   *httptest.Server
	host  string
	reg   http.Handler
	mu    atomic.Pointer[func(w http.ResponseWriter, r *http.Request) bool]
	count atomic.Int64
}

func newRegistry(t *testing.T, tls bool) *testRegistry {
	tr := &testRegistry{reg: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.count.Add(1)
		if f := tr.mu.Load(); f != nil && (*f)(w, r) {
			return
		}
		tr.reg.ServeHTTP(w, r)
	})
	if tls {
		tr.srv = httptest.NewTLSServer(h)
	} else {
		tr.srv = httptest.NewServer(h)
	}
	t.Cleanup(tr.srv.Close)
	u, _ := url.Parse(tr.srv.URL)
	tr.host = u.Host
	return tr
}

// roots is a pool of the TLS registry's certificate alone.
func (tr *testRegistry) roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(tr.srv.Certificate())
	return p
}

// intercept installs f in front of the registry: it returns true when it
// answered the request.
func (tr *testRegistry) intercept(f func(w http.ResponseWriter, r *http.Request) bool) {
	tr.mu.Store(&f)
}

func (tr *testRegistry) push(t *testing.T, repo string, im *testImage) policyapi.PullRef {
	t.Helper()
	put := func(kind, dgst, mediaType string, body []byte) {
		var u string
		method := http.MethodPut
		if kind == "blobs" {
			u = fmt.Sprintf("%s/v2/%s/blobs/uploads/?digest=%s", tr.srv.URL, repo, dgst)
			method = http.MethodPost
		} else {
			u = fmt.Sprintf("%s/v2/%s/manifests/%s", tr.srv.URL, repo, dgst)
		}
		req, _ := http.NewRequest(method, u, bytes.NewReader(body))
		if mediaType != "" {
			req.Header.Set("Content-Type", mediaType)
		}
		resp, err := tr.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("push %s %s: %s", kind, dgst, resp.Status)
		}
	}
	for _, l := range im.layers {
		put("blobs", digestOf(l), "", l)
	}
	put("blobs", digestOf(im.config), "", im.config)
	put("manifests", digestOf(im.manifest), ocispec.MediaTypeImageManifest, im.manifest)
	return policyapi.PullRef{Registry: tr.host, Repository: repo, Digest: digestOf(im.manifest)}
}

func baseLayers(t *testing.T) [][]byte {
	return [][]byte{
		tarOf(t, []entry{
			{name: "etc/", typ: tar.TypeDir},
			{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n"},
			{name: "etc/gone", body: "removed by a whiteout"},
			{name: "opq/", typ: tar.TypeDir},
			{name: "opq/old", body: "hidden by the opaque dir"},
			{name: "bin/", typ: tar.TypeDir},
			{name: "bin/app", body: "#!/bin/sh\necho hi\n", mode: 0o4755, uid: 1000},
			{name: "bin/sh", typ: tar.TypeSymlink, link: "/bin/app"},
			{name: "bin/app2", typ: tar.TypeLink, link: "bin/app"},
			{name: "dev/", typ: tar.TypeDir},
			{name: "dev/null", typ: tar.TypeChar},
		}),
		tarOf(t, []entry{
			{name: "etc/.wh.gone"},
			{name: "opq/", typ: tar.TypeDir},
			{name: "opq/.wh..wh..opq"},
			{name: "opq/new", body: "the upper layer's"},
			{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/:/bin/sh\n"},
			{name: "deep/er/file", body: "parents made"},
		}),
	}
}

func pullTo(t *testing.T, ref policyapi.PullRef, o Options) (string, *Image, error) {
	dir := t.TempDir()
	img, err := Pull(context.Background(), ref, dir, o)
	return dir, img, err
}

func read(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPullDigestPinned(t *testing.T) {
	tr := newRegistry(t, false)
	im := newImage(t, baseLayers(t), nil)
	ref := tr.push(t, "app", im)
	var last Progress
	dir, img, err := pullTo(t, ref, Options{PlainHTTP: true, Progress: func(p Progress) { last = p }})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, ref.Hex()); img.Dir != want {
		t.Errorf("Dir = %s, want %s", img.Dir, want)
	}
	root := img.Dir
	if got := read(t, filepath.Join(root, "etc/passwd")); !strings.Contains(got, "app:x:1000") {
		t.Errorf("etc/passwd is the lower layer's: %q", got)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("whiteout not applied: etc/gone: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "opq/old")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("opaque dir not applied: opq/old: %v", err)
	}
	if got := read(t, filepath.Join(root, "opq/new")); got != "the upper layer's" {
		t.Errorf("opq/new = %q", got)
	}
	if got := read(t, filepath.Join(root, "deep/er/file")); got != "parents made" {
		t.Errorf("deep/er/file = %q", got)
	}
	st, err := os.Lstat(filepath.Join(root, "bin/app"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSetuid == 0 || st.Mode().Perm() != 0o755 {
		t.Errorf("bin/app mode %v, want setuid 0755", st.Mode())
	}
	if l, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || l != "/bin/app" {
		t.Errorf("bin/sh -> %q, %v", l, err)
	}
	st2, err := os.Stat(filepath.Join(root, "bin/app2"))
	if err != nil || !os.SameFile(st, st2) {
		t.Errorf("bin/app2 is not a hard link of bin/app: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "dev/null")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a device node was created: %v", err)
	}
	if _, err := os.Stat(root + ".partial"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial dir left: %v", err)
	}
	var total int64
	for _, l := range im.layers {
		total += int64(len(l))
	}
	if last.Done != total || last.Total != total {
		t.Errorf("last progress %+v, want %d of %d", last, total, total)
	}
	// A second pull finds the verified directory.
	n := tr.count.Load()
	if _, err := Pull(context.Background(), ref, dir, Options{PlainHTTP: true}); err != nil {
		t.Fatal(err)
	}
	if tr.count.Load()-n > 4 {
		t.Errorf("the second pull fetched the layers again (%d requests)", tr.count.Load()-n)
	}
}

// flip serves blob dgst with one byte changed.
func flip(tr *testRegistry, path string, body []byte) {
	bad := bytes.Clone(body)
	bad[len(bad)/2] ^= 0x01
	tr.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != path {
			return false
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(bad)))
		w.Write(bad)
		return true
	})
}

func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 0 {
		t.Errorf("the failed pull left %v in %s", es, dir)
	}
}

func TestPullTamperedBlobRefused(t *testing.T) {
	tr := newRegistry(t, false)
	im := newImage(t, baseLayers(t), nil)
	ref := tr.push(t, "app", im)
	d := im.layerDigest(1)
	flip(tr, "/v2/app/blobs/"+d, im.layers[1])
	dir, _, err := pullTo(t, ref, Options{PlainHTTP: true})
	var de *DigestError
	if !errors.As(err, &de) || de.Digest != d || de.What != "layer blob" {
		t.Fatalf("err = %v, want a DigestError naming layer blob %s", err, d)
	}
	if !strings.Contains(err.Error(), d) {
		t.Errorf("error does not name the blob digest: %v", err)
	}
	assertEmpty(t, dir)
}

func TestPullLongerBlobRefused(t *testing.T) {
	tr := newRegistry(t, false)
	im := newImage(t, baseLayers(t), nil)
	ref := tr.push(t, "app", im)
	d := im.layerDigest(0)
	tr.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v2/app/blobs/"+d {
			return false
		}
		w.Write(append(bytes.Clone(im.layers[0]), 0))
		return true
	})
	dir, _, err := pullTo(t, ref, Options{PlainHTTP: true})
	var de *DigestError
	if !errors.As(err, &de) || de.Digest != d {
		t.Fatalf("err = %v, want a DigestError naming %s", err, d)
	}
	assertEmpty(t, dir)
}

func TestPullWrongManifestRefused(t *testing.T) {
	tr := newRegistry(t, false)
	ref := tr.push(t, "app", newImage(t, baseLayers(t), nil))
	other := newImage(t, baseLayers(t)[:1], nil)
	tr.push(t, "app", other)
	// The network answers the pinned digest with another image's manifest.
	tr.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v2/app/manifests/"+ref.Digest {
			return false
		}
		w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
		w.Write(other.manifest)
		return true
	})
	dir, _, err := pullTo(t, ref, Options{PlainHTTP: true})
	var de *DigestError
	if !errors.As(err, &de) || de.What != "manifest" || de.Digest != ref.Digest || de.Got != digestOf(other.manifest) {
		t.Fatalf("err = %v, want a manifest DigestError", err)
	}
	assertEmpty(t, dir)
}

func TestPullTamperedConfigRefused(t *testing.T) {
	tr := newRegistry(t, false)
	im := newImage(t, baseLayers(t), nil)
	ref := tr.push(t, "app", im)
	flip(tr, "/v2/app/blobs/"+digestOf(im.config), im.config)
	_, _, err := pullTo(t, ref, Options{PlainHTTP: true})
	var de *DigestError
	if !errors.As(err, &de) || de.What != "config" {
		t.Fatalf("err = %v, want a config DigestError", err)
	}
}

func TestPullDiffIDMismatchRefused(t *testing.T) {
	tr := newRegistry(t, false)
	tars := baseLayers(t)
	// The config pins layer 1's diff ID as another tar's: the blob
	// verifies, its content is not the image's.
	wrong := digestOf(tarOf(t, []entry{{name: "x", body: "other"}}))
	im := newImage(t, tars, []string{digestOf(tars[0]), wrong})
	ref := tr.push(t, "app", im)
	dir, _, err := pullTo(t, ref, Options{PlainHTTP: true})
	if err == nil || !strings.Contains(err.Error(), "diff ID is "+wrong) {
		t.Fatalf("err = %v, want a diff ID mismatch naming %s", err, wrong)
	}
	assertEmpty(t, dir)
}

func TestPullPathTraversalRefused(t *testing.T) {
	for name, es := range map[string][]entry{
		"dotdot":      {{name: "../../escaped", body: "x"}},
		"dotdot-deep": {{name: "a/../../escaped", body: "x"}},
		"link":        {{name: "a", body: "x"}, {name: "b", typ: tar.TypeLink, link: "../../etc/passwd"}},
	} {
		t.Run(name, func(t *testing.T) {
			tr := newRegistry(t, false)
			ref := tr.push(t, "app", newImage(t, [][]byte{tarOf(t, es)}, nil))
			dir, _, err := pullTo(t, ref, Options{PlainHTTP: true})
			if err == nil || !strings.Contains(err.Error(), "path traversal") {
				t.Fatalf("err = %v, want path traversal refused", err)
			}
			assertEmpty(t, dir)
			if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escaped")); err == nil {
				t.Error("a file escaped the image's directory")
			}
		})
	}
}

func TestPullSymlinkStaysInside(t *testing.T) {
	outside := t.TempDir()
	tr := newRegistry(t, false)
	// A symlink that climbs, then a file through it: resolved in the
	// image's root, never the guest's.
	ref := tr.push(t, "up", newImage(t, [][]byte{
		tarOf(t, []entry{{name: "up", typ: tar.TypeSymlink, link: "../../../../.."}}),
		tarOf(t, []entry{{name: "up/planted", body: "x"}}),
	}, nil))
	_, img, err := pullTo(t, ref, Options{PlainHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(img.Dir, "planted")); err != nil {
		t.Errorf("up/planted did not resolve inside the root: %v", err)
	}
	// An absolute symlink to a guest directory: a file through it lands
	// in the image's root (there: nothing, so it fails), never outside.
	ref = tr.push(t, "abs", newImage(t, [][]byte{
		tarOf(t, []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}}),
		tarOf(t, []entry{{name: "evil/planted", body: "x"}}),
	}, nil))
	dir, _, err := pullTo(t, ref, Options{PlainHTTP: true})
	if es, _ := os.ReadDir(outside); len(es) != 0 {
		t.Fatalf("the layer wrote through its symlink outside the image: %v", es)
	}
	if err == nil {
		t.Fatal("a file under a dangling symlink was written")
	}
	assertEmpty(t, dir)
}

func TestPullIndex(t *testing.T) {
	tr := newRegistry(t, false)
	im := newImage(t, baseLayers(t), nil)
	mref := tr.push(t, "app", im)
	arm := newImage(t, baseLayers(t)[:1], nil)
	tr.push(t, "app", arm)
	idx := ocispec.Index{MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{
		{MediaType: ocispec.MediaTypeImageManifest, Digest: digestDigest(digestOf(arm.manifest)), Size: int64(len(arm.manifest)), Platform: &ocispec.Platform{OS: "linux", Architecture: "arm64"}},
		{MediaType: ocispec.MediaTypeImageManifest, Digest: digestDigest(mref.Digest), Size: int64(len(im.manifest)), Platform: &ocispec.Platform{OS: "linux", Architecture: "amd64"}},
	}}
	idx.SchemaVersion = 2
	ib, _ := json.Marshal(idx)
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/v2/app/manifests/%s", tr.srv.URL, digestOf(ib)), bytes.NewReader(ib))
	req.Header.Set("Content-Type", ocispec.MediaTypeImageIndex)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("push index: %v %v", err, resp)
	}
	ref := mref
	ref.Digest = digestOf(ib)
	_, img, err := pullTo(t, ref, Options{PlainHTTP: true, OS: "linux", Arch: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	if img.Manifest != mref.Digest || filepath.Base(img.Dir) != mref.Hex() {
		t.Errorf("pulled manifest %s into %s, want amd64's %s", img.Manifest, img.Dir, mref.Digest)
	}
	// The index names the manifest by digest: another one served for it
	// is refused.
	tr.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v2/app/manifests/"+mref.Digest {
			return false
		}
		w.Write(arm.manifest)
		return true
	})
	_, _, err = pullTo(t, ref, Options{PlainHTTP: true, OS: "linux", Arch: "amd64"})
	var de *DigestError
	if !errors.As(err, &de) || de.Digest != mref.Digest {
		t.Fatalf("err = %v, want the platform manifest refused", err)
	}
}

// basicAuth wraps a registry in Basic authentication and counts the
// requests that carried credentials.
func basicAuth(tr *testRegistry, user, pass string, withCreds *atomic.Int64) {
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	tr.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "" {
			withCreds.Add(1)
		}
		if r.Header.Get("Authorization") == want {
			return false
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		w.WriteHeader(http.StatusUnauthorized)
		return true
	})
}

func TestPullCredentialsOverTLS(t *testing.T) {
	tr := newRegistry(t, true)
	ref := tr.push(t, "app", newImage(t, baseLayers(t), nil))
	var withCreds atomic.Int64
	basicAuth(tr, "u", "p", &withCreds)
	o := Options{Transport: tr.srv.Client().Transport, Roots: tr.roots(), Auth: &authn.AuthConfig{Username: "u", Password: "p"}}
	if _, _, err := pullTo(t, ref, o); err != nil {
		t.Fatal(err)
	}
	if withCreds.Load() == 0 {
		t.Error("no request carried the credentials")
	}
	o.Auth = nil
	if _, _, err := pullTo(t, ref, o); err == nil {
		t.Error("an anonymous pull from the authenticating registry succeeded")
	}
}

func TestPullCredentialsNeverOverHTTP(t *testing.T) {
	tr := newRegistry(t, false)
	ref := tr.push(t, "app", newImage(t, baseLayers(t), nil))
	var withCreds atomic.Int64
	basicAuth(tr, "u", "p", &withCreds)
	n := tr.count.Load()
	auth := &authn.AuthConfig{Username: "u", Password: "p"}
	// Asked to: refused before any request.
	if _, _, err := pullTo(t, ref, Options{PlainHTTP: true, Auth: auth}); err == nil || !strings.Contains(err.Error(), "never sent over plain HTTP") {
		t.Fatalf("err = %v", err)
	}
	if tr.count.Load() != n {
		t.Errorf("%d requests made", tr.count.Load()-n)
	}
	// Not asked to: the registry at a private address (which
	// go-containerregistry would try over HTTP) is reached over HTTPS
	// only, and fails.
	if _, _, err := pullTo(t, ref, Options{Auth: auth}); err == nil {
		t.Fatal("pulled over plain HTTP without pull_plain_http")
	}
	if withCreds.Load() != 0 {
		t.Errorf("%d plain-HTTP requests carried the credentials", withCreds.Load())
	}
}

func TestPullTokenRealmOverHTTPRefused(t *testing.T) {
	// A TLS registry whose challenge names a plain-HTTP token service
	// (the network can rewrite nothing inside TLS, but a registry
	// misconfigured so, or a redirect, must not take the credentials).
	var tokenHits atomic.Int64
	token := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokenHits.Add(1)
		w.Write([]byte(`{"token":"t"}`))
	}))
	defer token.Close()
	tr := newRegistry(t, true)
	ref := tr.push(t, "app", newImage(t, baseLayers(t), nil))
	tr.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") == "Bearer t" {
			return false
		}
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="%s/token",service="test"`, token.URL))
		w.WriteHeader(http.StatusUnauthorized)
		return true
	})
	o := Options{Transport: tr.srv.Client().Transport, Roots: tr.roots(), Auth: &authn.AuthConfig{Username: "u", Password: "p"}}
	if _, _, err := pullTo(t, ref, o); err == nil || !strings.Contains(err.Error(), "HTTPS only") {
		t.Fatalf("err = %v, want the plain-HTTP token request refused", err)
	}
	if tokenHits.Load() != 0 {
		t.Errorf("the plain-HTTP token service got %d requests", tokenHits.Load())
	}
}

func digestDigest(s string) digest.Digest { return digest.Digest(s) }
