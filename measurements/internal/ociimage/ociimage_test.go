package ociimage

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/measurements/internal/ocilayout"
	"github.com/c8s-dev/c8s/measurements/layer"
)

// twoImages writes a layout of a two-layer image (app, gzip) and a
// multi-platform one-layer image (tool, zstd).
func twoImages(t *testing.T) (string, []digest.Digest) {
	t.Helper()
	dir := t.TempDir()
	ds, err := ocilayout.Write(dir,
		ocilayout.Image{Name: "example.com/app:1", Config: ocispec.ImageConfig{Cmd: []string{"/app"}}, Layers: []map[string]string{
			{"etc/passwd": "root:x:0:0::/:/bin/sh\n", "bin/app": "#!/bin/sh\n"},
			{"etc/.wh.passwd": "", "data/x": strings.Repeat("x", 10000)},
		}},
		ocilayout.Image{Name: "example.com/tool:1", Config: ocispec.ImageConfig{Cmd: []string{"/tool"}}, MultiPlatform: true, Compression: "zstd",
			Layers: []map[string]string{{"tool": "t"}}},
	)
	if err != nil {
		t.Fatal(err)
	}
	return dir, ds
}

// wantLayers builds each layer's disk straight from its blob, as the
// node would: what MeasureLayers must report.
func wantLayers(t *testing.T, dir string, img *Image) []layer.Info {
	t.Helper()
	var out []layer.Info
	for _, d := range img.Manifest.Layers {
		blob, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", d.Digest.Encoded()))
		if err != nil {
			t.Fatal(err)
		}
		r, err := layer.Decompress(bytes.NewReader(blob), d.MediaType)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(t.TempDir(), "disk"))
		if err != nil {
			t.Fatal(err)
		}
		info, err := layer.Build(r, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, info)
	}
	return out
}

func checkLayers(t *testing.T, img *Image, want []layer.Info) {
	t.Helper()
	got, err := MeasureLayers(context.Background(), img, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d layers, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].Disk != want[i] || got[i].Blob.Digest != img.Manifest.Layers[i].Digest || got[i].Disk.DiffID != img.ConfigFile.RootFS.DiffIDs[i] {
			t.Errorf("layer %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// The same image read from a layout directory, its tar, containerd's
// content store and a registry measures to the same layers.
func TestSources(t *testing.T) {
	ctx := context.Background()
	dir, ds := twoImages(t)
	tarball := filepath.Join(t.TempDir(), "layout.tar.gz")
	if err := ocilayout.WriteTar(tarball, dir); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(t.TempDir(), "containerd")
	if err := os.MkdirAll(filepath.Join(store, ContentStoreDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(store, ContentStoreDir, "blobs"), os.DirFS(filepath.Join(dir, "blobs"))); err != nil {
		t.Fatal(err)
	}
	reg := ocilayout.StartRegistry(t)
	if err := ocilayout.Push(reg, "c8s/app", "1", dir, ds[0]); err != nil {
		t.Fatal(err)
	}
	if err := ocilayout.Push(reg, "c8s/tool", "1", dir, ds[1]); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"app", "tool"} {
		ref := "example.com/" + name + ":1"
		base, err := OpenLayout(ctx, dir, ref)
		if err != nil {
			t.Fatal(err)
		}
		want := wantLayers(t, dir, base)
		opens := map[string]func() (*Image, error){
			"layout":        func() (*Image, error) { return base, nil },
			"tar":           func() (*Image, error) { return OpenLayout(ctx, tarball, ref) },
			"content store": func() (*Image, error) { return OpenContentStore(ctx, store, ds[i]) },
			"content dir":   func() (*Image, error) { return OpenContentStore(ctx, filepath.Join(store, ContentStoreDir), ds[i]) },
			"registry tag":  func() (*Image, error) { return OpenRegistry(ctx, reg+"/c8s/"+name+":1", RegistryOptions{}) },
			"registry pin": func() (*Image, error) {
				return OpenRegistry(ctx, reg+"/c8s/"+name+"@"+ds[i].String(), RegistryOptions{})
			},
		}
		for how, open := range opens {
			t.Run(name+"/"+how, func(t *testing.T) {
				img, err := open()
				if err != nil {
					t.Fatal(err)
				}
				if img.ManifestDigest() != base.ManifestDigest() || img.Digests[0] != ds[i] || img.Manifest.Config.Digest != base.Manifest.Config.Digest {
					t.Errorf("digests %v, want %v", img.Digests, base.Digests)
				}
				checkLayers(t, img, want)
			})
		}
	}
}

// rewriteConfig changes the config of the layout's only image and
// returns the new index entry's digest.
func rewriteConfig(t *testing.T, dir string, change func(*ocispec.Image)) {
	t.Helper()
	blob := func(d digest.Digest) string { return filepath.Join(dir, "blobs", "sha256", d.Encoded()) }
	put := func(v any) digest.Digest {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		d := digest.FromBytes(data)
		if err := os.WriteFile(blob(d), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	get := func(p string, v any) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatal(err)
		}
	}
	var idx ocispec.Index
	get(filepath.Join(dir, "index.json"), &idx)
	var m ocispec.Manifest
	get(blob(idx.Manifests[0].Digest), &m)
	var cfg ocispec.Image
	get(blob(m.Config.Digest), &cfg)
	change(&cfg)
	m.Config.Digest = put(cfg)
	data, _ := json.Marshal(cfg)
	m.Config.Size = int64(len(data))
	idx.Manifests[0].Digest = put(m)
	data, _ = json.Marshal(m)
	idx.Manifests[0].Size = int64(len(data))
	data, _ = json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(dir, "index.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A layer whose diff ID is not the config's, a layer blob changed, a
// layer missing from a content store: refused, naming the layer.
func TestMeasureRefuses(t *testing.T) {
	ctx := context.Background()
	layout := func(t *testing.T) string {
		dir := t.TempDir()
		if _, err := ocilayout.Write(dir, ocilayout.Image{Name: "x", Layers: []map[string]string{{"a": "1"}, {"b": "2"}}}); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	t.Run("diff id", func(t *testing.T) {
		dir := layout(t)
		rewriteConfig(t, dir, func(c *ocispec.Image) { c.RootFS.DiffIDs[1] = digest.FromString("another layer") })
		img, err := OpenLayout(ctx, dir, "x")
		if err != nil {
			t.Fatal(err)
		}
		_, err = MeasureLayers(ctx, img, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), "layer 2 ("+img.Manifest.Layers[1].Digest.String()+"): its diff ID is") {
			t.Fatalf("MeasureLayers = %v", err)
		}
	})
	t.Run("diff ids count", func(t *testing.T) {
		dir := layout(t)
		rewriteConfig(t, dir, func(c *ocispec.Image) { c.RootFS.DiffIDs = c.RootFS.DiffIDs[:1] })
		if _, err := OpenLayout(ctx, dir, "x"); err == nil || !strings.Contains(err.Error(), "has 2 layers, its config's rootfs.diff_ids 1") {
			t.Fatalf("OpenLayout = %v", err)
		}
	})
	t.Run("changed blob", func(t *testing.T) {
		dir := layout(t)
		img, err := OpenLayout(ctx, dir, "x")
		if err != nil {
			t.Fatal(err)
		}
		// Another valid gzip layer in the first layer's place.
		other := t.TempDir()
		if _, err := ocilayout.Write(other, ocilayout.Image{Name: "y", Layers: []map[string]string{{"a": "2"}}}); err != nil {
			t.Fatal(err)
		}
		oimg, err := OpenLayout(ctx, other, "y")
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(filepath.Join(other, "blobs", "sha256", oimg.Manifest.Layers[0].Digest.Encoded()))
		d := img.Manifest.Layers[0].Digest
		if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", d.Encoded()), data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err = MeasureLayers(ctx, img, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), "layer 1 ("+d.String()+")") || !strings.Contains(err.Error(), "does not have its digest") {
			t.Fatalf("MeasureLayers = %v", err)
		}
	})
	t.Run("content store without the layer", func(t *testing.T) {
		dir := layout(t)
		img, err := OpenLayout(ctx, dir, "x")
		if err != nil {
			t.Fatal(err)
		}
		d := img.Manifest.Layers[1].Digest
		if err := os.Remove(filepath.Join(dir, "blobs", "sha256", d.Encoded())); err != nil {
			t.Fatal(err)
		}
		cs, err := OpenContentStore(ctx, dir, img.Digests[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := MeasureLayers(ctx, cs, ""); err == nil || !strings.Contains(err.Error(), d.String()+" is not in the content store") {
			t.Fatalf("MeasureLayers = %v", err)
		}
		if _, err := OpenContentStore(ctx, dir, d); err == nil {
			t.Error("a missing blob opens")
		}
		if _, err := OpenContentStore(ctx, dir, img.Manifest.Config.Digest); err == nil || !strings.Contains(err.Error(), "neither an image index nor a manifest") {
			t.Errorf("a config as the manifest: %v", err)
		}
		if _, err := OpenContentStore(ctx, t.TempDir(), img.Digests[0]); err == nil || !strings.Contains(err.Error(), "not containerd's content store") {
			t.Errorf("an empty directory: %v", err)
		}
	})
}

// A registry (here a proxy in front of one) that serves a changed layer,
// or another manifest for a pinned digest, is refused.
func TestRegistryTampering(t *testing.T) {
	ctx := context.Background()
	dir, ds := twoImages(t)
	reg := ocilayout.StartRegistry(t)
	if err := ocilayout.Push(reg, "c8s/app", "1", dir, ds[0]); err != nil {
		t.Fatal(err)
	}
	img, err := OpenLayout(ctx, dir, "example.com/app:1")
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse("http://" + reg)
	var tamper func(path string, body []byte) []byte
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if tamper != nil {
			body = tamper(resp.Request.URL.Path, body)
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Del("Content-Length")
		return nil
	}
	srv := httptest.NewServer(proxy)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	layerPath := "/v2/c8s/app/blobs/" + img.Manifest.Layers[1].Digest.String()
	tamper = func(p string, body []byte) []byte {
		if p == layerPath {
			body = bytes.Clone(body)
			body[len(body)/2] ^= 1
		}
		return body
	}
	got, err := OpenRegistry(ctx, host+"/c8s/app:1", RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := MeasureLayers(ctx, got, ""); err == nil || !strings.Contains(err.Error(), "layer 2 ("+img.Manifest.Layers[1].Digest.String()+")") {
		t.Fatalf("a changed layer: %v", err)
	}
	// The manifest served for a pinned digest is not that digest's.
	tamper = func(p string, body []byte) []byte {
		if strings.Contains(p, "/manifests/") {
			return append(bytes.Clone(body), ' ')
		}
		return body
	}
	if _, err := OpenRegistry(ctx, host+"/c8s/app@"+ds[0].String(), RegistryOptions{}); err == nil || !strings.Contains(err.Error(), "not the one the reference pins") {
		t.Fatalf("another manifest for a pin: %v", err)
	}
	// An unknown tag.
	tamper = nil
	if _, err := OpenRegistry(ctx, host+"/c8s/app:2", RegistryOptions{}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("an unknown tag: %v", err)
	}
}

// A registry that asks for a bearer token gets one from its realm.
func TestRegistryToken(t *testing.T) {
	dir, ds := twoImages(t)
	reg := ocilayout.StartRegistry(t)
	if err := ocilayout.Push(reg, "c8s/app", "1", dir, ds[0]); err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse("http://" + reg)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var tokenScope string
	mux := http.NewServeMux()
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		tokenScope = r.URL.Query().Get("service") + " " + r.URL.Query().Get("scope")
		_, _ = w.Write([]byte(`{"token":"t0k"}`))
	})
	var srv *httptest.Server
	mux.HandleFunc("/v2/", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer t0k" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+srv.URL+`/token",service="test-registry",scope="repository:c8s/app:pull"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		proxy.ServeHTTP(w, r)
	})
	srv = httptest.NewServer(mux)
	defer srv.Close()
	img, err := OpenRegistry(context.Background(), strings.TrimPrefix(srv.URL, "http://")+"/c8s/app:1", RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tokenScope != "test-registry repository:c8s/app:pull" {
		t.Errorf("token asked for %q", tokenScope)
	}
	if _, err := MeasureLayers(context.Background(), img, ""); err != nil {
		t.Fatal(err)
	}
}

func TestParseReference(t *testing.T) {
	pin := "sha256:" + strings.Repeat("a", 64)
	for ref, want := range map[string]Reference{
		"busybox":                        {Registry: "registry-1.docker.io", Repository: "library/busybox", Tag: "latest"},
		"docker.io/library/busybox:1.36": {Registry: "registry-1.docker.io", Repository: "library/busybox", Tag: "1.36"},
		"ghcr.io/example/app@" + pin:     {Registry: "ghcr.io", Repository: "example/app", Digest: digest.Digest(pin)},
		"127.0.0.1:5000/app:tag":         {Registry: "127.0.0.1:5000", Repository: "app", Tag: "tag"},
		"localhost/a/b:t@" + pin:         {Registry: "localhost", Repository: "a/b", Tag: "t", Digest: digest.Digest(pin)},
		"example/app":                    {Registry: "registry-1.docker.io", Repository: "example/app", Tag: "latest"},
		"registry.k8s.io/pause:3.10.1":   {Registry: "registry.k8s.io", Repository: "pause", Tag: "3.10.1"},
	} {
		got, err := ParseReference(ref)
		if err != nil || got != want {
			t.Errorf("ParseReference(%q) = %+v, %v; want %+v", ref, got, err, want)
		}
	}
	for _, bad := range []string{"", "UPPER/case", "a@sha256:12", "a:b:c", "a/:t"} {
		if r, err := ParseReference(bad); err == nil {
			t.Errorf("ParseReference(%q) = %+v", bad, r)
		}
	}
	for host, want := range map[string]bool{"127.0.0.1:5000": true, "localhost": true, "[::1]:80": true, "ghcr.io": false, "10.0.0.1:5000": false} {
		if loopback(host) != want {
			t.Errorf("loopback(%s) = %v", host, !want)
		}
	}
}
