package agent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/registry"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/policy"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// pullServer is an in-memory registry with one image of one layer, whose
// layer blob can be held back or flipped.
type pullServer struct {
	img      policy.PullImage
	blob     string // the layer blob's path
	hold     chan struct{}
	tamper   atomic.Bool
	blobGets atomic.Int64
}

func newPullServer(t *testing.T) *pullServer {
	t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	body := []byte("pulled by the guest\n")
	tw.WriteHeader(&tar.Header{Name: "hello", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	var gz bytes.Buffer
	z := gzip.NewWriter(&gz)
	z.Write(tb.Bytes())
	z.Close()
	layer := gz.Bytes()
	cfg, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux", "rootfs": map[string]any{"type": "layers", "diff_ids": []string{sha(tb.Bytes())}}})
	man, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(cfg), "size": len(cfg)},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(layer), "size": len(layer)}},
	})
	ps := &pullServer{blob: "/v2/app/blobs/" + sha(layer), hold: make(chan struct{})}
	close(ps.hold)
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == ps.blob {
			ps.blobGets.Add(1)
			<-ps.hold
			if ps.tamper.Load() {
				bad := bytes.Clone(layer)
				bad[len(bad)/2] ^= 1
				w.Write(bad)
				return
			}
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	put := func(method, path string, b []byte, ct string) {
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(b))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode/100 != 2 {
			t.Fatalf("%s %s: %v %v", method, path, err, resp)
		}
		resp.Body.Close()
	}
	put(http.MethodPost, "/v2/app/blobs/uploads/?digest="+sha(layer), layer, "")
	put(http.MethodPost, "/v2/app/blobs/uploads/?digest="+sha(cfg), cfg, "")
	put(http.MethodPut, "/v2/app/manifests/"+sha(man), man, "application/vnd.oci.image.manifest.v1+json")
	u, _ := url.Parse(srv.URL)
	ps.img = policy.PullImage{Ref: policyapi.PullRef{Registry: u.Host, Repository: "app", Digest: sha(man)}, PlainHTTP: true}
	return ps
}

func pullService(t *testing.T, wait time.Duration) *Service {
	dir := t.TempDir()
	return &Service{cfg: Config{StateDir: filepath.Join(dir, "containers"), ImagesDir: filepath.Join(dir, "images"), PullWait: wait}, containers: map[string]*container{}}
}

// Two containers of one image share one pull; the image is the verified
// directory named by its manifest digest.
func TestWaitPullShared(t *testing.T) {
	ps := newPullServer(t)
	s := pullService(t, time.Minute)
	var wg sync.WaitGroup
	dirs := make([]string, 2)
	errs := make([]error, 2)
	for i := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dirs[i], errs[i] = s.waitPull(context.Background(), fmt.Sprint("c", i), ps.img, nil)
		}()
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
	}
	if dirs[0] != dirs[1] || filepath.Base(dirs[0]) != ps.img.Ref.Hex() {
		t.Fatalf("dirs %v, want one named %s", dirs, ps.img.Ref.Hex())
	}
	if b, err := os.ReadFile(filepath.Join(dirs[0], "hello")); err != nil || string(b) != "pulled by the guest\n" {
		t.Fatalf("hello: %q, %v", b, err)
	}
	if n := ps.blobGets.Load(); n != 1 {
		t.Fatalf("the layer blob was fetched %d times, want once", n)
	}
}

// A pull that outlasts PullWait is reported Unavailable with its
// progress, and goes on: the retry finds it done, without pulling again.
func TestWaitPullProgress(t *testing.T) {
	ps := newPullServer(t)
	ps.hold = make(chan struct{})
	s := pullService(t, 100*time.Millisecond)
	_, err := s.waitPull(context.Background(), "c1", ps.img, nil)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "pulling "+ps.img.Ref.String()+": ") || !strings.Contains(err.Error(), "retry") {
		t.Fatalf("err = %v, want Unavailable with the pull's progress", err)
	}
	close(ps.hold)
	s.cfg.PullWait = time.Minute
	if _, err := s.waitPull(context.Background(), "c1", ps.img, nil); err != nil {
		t.Fatal(err)
	}
	if n := ps.blobGets.Load(); n != 1 {
		t.Fatalf("the layer blob was fetched %d times, want once", n)
	}
}

// A blob the network changed fails the create naming it (DataLoss), and
// leaves nothing; the next create pulls again.
func TestWaitPullTamperedBlob(t *testing.T) {
	ps := newPullServer(t)
	ps.tamper.Store(true)
	s := pullService(t, time.Minute)
	_, err := s.waitPull(context.Background(), "c1", ps.img, nil)
	digest := strings.TrimPrefix(ps.blob, "/v2/app/blobs/")
	if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), digest) {
		t.Fatalf("err = %v, want DataLoss naming %s", err, digest)
	}
	if es, _ := os.ReadDir(s.imagesDir()); len(es) != 0 {
		t.Fatalf("the refused pull left %v", es)
	}
	ps.tamper.Store(false)
	dir, err := s.waitPull(context.Background(), "c1", ps.img, nil)
	if err != nil {
		t.Fatalf("pull after the blob was served intact: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "hello")); err != nil {
		t.Fatal(err)
	}
}

// An empty root is the host offering none; anything else is a root.
func TestEmptyRoot(t *testing.T) {
	if !emptyRoot(&agentapi.Rootfs{}) {
		t.Fatal("an empty Rootfs is not empty")
	}
	for _, r := range []*agentapi.Rootfs{{Fstype: "ext4"}, {Options: []string{"ro"}}, rootfsReq()} {
		if emptyRoot(r) {
			t.Fatalf("%v is empty", r)
		}
	}
	root, _, err := rootOf("c1", &agentapi.Rootfs{})
	if err != nil || !root.Empty {
		t.Fatalf("rootOf(empty) = %+v, %v", root, err)
	}
}

// Registry credentials come only from the pod's key broker: without one
// (no kbs.url in the init data) a rule's pull_auth fails the pull, before
// anything is sent to the registry.
func TestPullAuthNeedsBroker(t *testing.T) {
	ps := newPullServer(t)
	img := ps.img
	img.PlainHTTP, img.Auth = false, "kbs:///default/registry/auth"
	s := pullService(t, time.Minute)
	_, err := s.waitPull(context.Background(), "c1", img, nil)
	if !errdefs.IsFailedPrecondition(err) || errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "names no key broker (kbs.url)") {
		t.Fatalf("err = %v, want the missing broker named", err)
	}
	if n := ps.blobGets.Load(); n != 0 {
		t.Fatalf("%d blob requests", n)
	}
}
