package pull

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// TestMaliciousHostSecondPullWritesIntoVerifiedImage: two pulls of one
// image (two rules that name it with other credentials, roots or plain
// HTTP are two pulls, and the agent runs them at once). The host carries
// both streams. It holds the first pull at its first layer until the
// second has started unpacking, lets the first verify and rename its
// tree, and then has the second write the rest of its unverified layer.
// Had both pulls unpacked into one directory, that write would land in
// the verified image through the directory the second opened before the
// rename.
func TestMaliciousHostSecondPullWritesIntoVerifiedImage(t *testing.T) {
	im := newImage(t, baseLayers(t), nil)
	good := newRegistry(t, false) // the rule's registry
	evil := newRegistry(t, false) // a mirror the host serves
	refA := good.push(t, "app", im)
	refB := evil.push(t, "app", im)
	if refA.Digest != refB.Digest {
		t.Fatal("the two pushes differ in their manifest digest")
	}
	dir := t.TempDir()
	layer0 := "/v2/app/blobs/" + im.layerDigest(0)

	aWaiting, bUnpacking, aDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	aHeld := false
	good.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == layer0 && !aHeld {
			aHeld = true
			close(aWaiting)
			<-bUnpacking
		}
		return false
	})
	evil.intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != layer0 {
			return false
		}
		w.Header().Set("Content-Length", "100000")
		w.WriteHeader(http.StatusOK)
		z := gzip.NewWriter(w)
		tw := tar.NewWriter(z)
		// A first entry, so that the second pull has opened the tree it
		// unpacks into: it is there once the entry is.
		_ = tw.WriteHeader(&tar.Header{Name: "x", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
		_, _ = tw.Write([]byte("x"))
		_ = tw.Flush()
		_ = z.Flush()
		w.(http.Flusher).Flush()
		for deadline := time.Now().Add(10 * time.Second); ; {
			if m, _ := filepath.Glob(filepath.Join(dir, "*.partial*", "x")); len(m) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Error("the second pull never unpacked its first entry")
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		close(bUnpacking)
		<-aDone
		evilApp := []byte("#!/bin/sh\necho host code\n")
		_ = tw.WriteHeader(&tar.Header{Name: "bin/app", Typeflag: tar.TypeReg, Mode: 0o4755, Size: int64(len(evilApp))})
		_, _ = tw.Write(evilApp)
		_ = tw.Close()
		_ = z.Close()
		return true // short of the manifest's size: the second pull fails
	})

	var imgA *Image
	var errA error
	doneA := make(chan struct{})
	go func() {
		defer close(doneA)
		imgA, errA = Pull(context.Background(), refA, dir, Options{PlainHTTP: true})
	}()
	<-aWaiting
	errB := make(chan error, 1)
	go func() {
		_, err := Pull(context.Background(), refB, dir, Options{PlainHTTP: true})
		errB <- err
	}()
	<-doneA
	close(aDone)
	if errA != nil {
		t.Fatalf("the first pull: %v", errA)
	}
	if err := <-errB; err == nil {
		t.Fatal("the second pull verified a short layer")
	}
	got, err := os.ReadFile(filepath.Join(imgA.Dir, "bin/app"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte("#!/bin/sh\necho hi\n"); !bytes.Equal(got, want) {
		t.Fatalf("the verified image's bin/app is %q, want %q: a failed, unverified pull wrote into it", got, want)
	}
	if _, err := os.Stat(filepath.Join(imgA.Dir, "x")); err == nil {
		t.Error("the verified image holds x, which only the failed pull's stream had")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*.partial*")); len(m) > 0 {
		t.Errorf("left behind: %v", m)
	}
}

// TestConcurrentPullsOfOneImage: two pulls of one image that both verify
// end with one image directory, which both return.
func TestConcurrentPullsOfOneImage(t *testing.T) {
	im := newImage(t, baseLayers(t), nil)
	a, b := newRegistry(t, false), newRegistry(t, false)
	refA, refB := a.push(t, "app", im), b.push(t, "app", im)
	dir := t.TempDir()
	type result struct {
		img *Image
		err error
	}
	res := make(chan result, 2)
	for _, ref := range []policyapi.PullRef{refA, refB} {
		go func() {
			img, err := Pull(context.Background(), ref, dir, Options{PlainHTTP: true})
			res <- result{img, err}
		}()
	}
	for range 2 {
		r := <-res
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got, err := os.ReadFile(filepath.Join(r.img.Dir, "bin/app")); err != nil || string(got) != "#!/bin/sh\necho hi\n" {
			t.Fatalf("bin/app: %q, %v", got, err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the images dir holds %v, want the one image", names)
	}
}
