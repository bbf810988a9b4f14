package ocilayout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// StartRegistry runs Debian's docker-registry (the distribution registry,
// as hack/conformance.sh does) on a free port of 127.0.0.1 for the test,
// and returns its host:port. It fails the test when docker-registry is
// not installed (make deps installs it).
func StartRegistry(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		tb.Fatalf("docker-registry is needed (Debian package docker-registry; run make deps): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := tb.TempDir()
	cfg := filepath.Join(dir, "registry.yml")
	conf := fmt.Sprintf("version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: %s}\n", filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "serve", cfg)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for range 100 {
		if resp, err := http.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("docker-registry did not start on %s:\n%s", addr, log.String())
	return ""
}

// Push pushes the image top (an entry of the layout's index.json, as
// Write returns it) from the layout in dir to repo:tag of the registry at
// addr (plain http): every blob of the layout, then the manifests below
// top by digest, then top by tag.
func Push(addr, repo, tag, dir string, top digest.Digest) error {
	base := "http://" + addr + "/v2/" + repo
	blobs := filepath.Join(dir, "blobs", "sha256")
	entries, err := os.ReadDir(blobs)
	if err != nil {
		return err
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(blobs, e.Name()))
		if err != nil {
			return err
		}
		if err := pushBlob(base, data); err != nil {
			return err
		}
	}
	var put func(d digest.Digest, ref string) error
	put = func(d digest.Digest, ref string) error {
		data, err := os.ReadFile(filepath.Join(blobs, d.Encoded()))
		if err != nil {
			return err
		}
		var m struct {
			MediaType string               `json:"mediaType"`
			Manifests []ocispec.Descriptor `json:"manifests"`
		}
		if err := json.Unmarshal(data, &m); err != nil {
			return err
		}
		for _, sub := range m.Manifests {
			if err := put(sub.Digest, sub.Digest.String()); err != nil {
				return err
			}
		}
		return do(http.MethodPut, base+"/manifests/"+ref, m.MediaType, data, http.StatusCreated)
	}
	return put(top, tag)
}

// pushBlob uploads a blob in one PUT (the monolithic upload).
func pushBlob(base string, data []byte) error {
	resp, err := http.Post(base+"/blobs/uploads/", "", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("start upload: %s", resp.Status)
	}
	loc := resp.Header.Get("Location")
	if !strings.HasPrefix(loc, "http") {
		loc = strings.SplitN(base, "/v2/", 2)[0] + loc
	}
	sep := "?"
	if strings.Contains(loc, "?") {
		sep = "&"
	}
	return do(http.MethodPut, loc+sep+"digest="+digest.FromBytes(data).String(), "application/octet-stream", data, http.StatusCreated)
}

func do(method, url, contentType string, body []byte, want int) error {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, msg)
	}
	return nil
}
