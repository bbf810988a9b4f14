package policygen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/measurements/internal/ocilayout"
)

const passwd = "root:x:0:0::/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\n"

// LoadImage reads the config of the image a reference names from a
// layout directory or a tar of one, and its users from its layers.
func TestLoadImage(t *testing.T) {
	dir := t.TempDir()
	cfg := ocispec.ImageConfig{Entrypoint: []string{"/app"}, Env: []string{"A=1"}, WorkingDir: "/w", User: "app"}
	digests, err := ocilayout.Write(dir,
		ocilayout.Image{Name: "ghcr.io/example/app:1.0", Config: cfg, Layers: []map[string]string{
			{"etc/passwd": "old:x:5:5::/:/bin/sh\n", "etc/group": "app:x:1002:\n"},
			{"etc/passwd": passwd},
		}},
		ocilayout.Image{Name: "ghcr.io/example/other:1.0", Config: ocispec.ImageConfig{Cmd: []string{"/other"}}, MultiPlatform: true},
	)
	if err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(t.TempDir(), "layout.tar.gz")
	if err := ocilayout.WriteTar(tarball, dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, tarball} {
		img, err := LoadImage(p, "ghcr.io/example/app@"+digests[0].String())
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if img.Config.WorkingDir != "/w" || img.Config.Entrypoint[0] != "/app" {
			t.Fatalf("%s: config %+v", p, img.Config)
		}
		pw, gr, err := img.UserDB()
		if err != nil || string(pw) != passwd || string(gr) != "app:x:1002:\n" {
			t.Fatalf("%s: UserDB = %q, %q, %v", p, pw, gr, err)
		}
		u, _, err := resolveUser("app", img)
		if err != nil || u.uid != 1001 || u.gid != 1002 {
			t.Fatalf("%s: resolveUser(app) = %+v, %v", p, u, err)
		}
		// The multi-platform image gives its linux/amd64 manifest.
		other, err := LoadImage(p, "ghcr.io/example/other:1.0")
		if err != nil || len(other.Config.Cmd) != 1 || other.Config.Cmd[0] != "/other" || len(other.Digests) != 2 {
			t.Fatalf("%s: the multi-platform image: %+v, %v", p, other, err)
		}
	}
	// A pin of another image, and a reference the layout does not name.
	if _, err := LoadImage(dir, "ghcr.io/example/app@sha256:"+strings.Repeat("0", 64)); err == nil || !strings.Contains(err.Error(), "holds 2 images") {
		t.Errorf("a pin the layout does not hold: %v", err)
	}
	if _, err := LoadImage(dir, "ghcr.io/example/third:1.0"); err == nil || !strings.Contains(err.Error(), "none is named") {
		t.Errorf("an image the layout does not hold: %v", err)
	}
	// A blob that is not what its digest says.
	blob := filepath.Join(dir, "blobs", "sha256", digests[0].Encoded())
	data, _ := os.ReadFile(blob)
	if err := os.WriteFile(blob, append(data, ' '), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadImage(dir, "ghcr.io/example/app:1.0"); err == nil || !strings.Contains(err.Error(), "blob "+digests[0].String()+" is larger than") {
		t.Errorf("a tampered manifest: %v", err)
	}
}

// A single-image layout is the image of any reference, unless the
// reference pins another digest.
func TestLoadImagePin(t *testing.T) {
	dir := t.TempDir()
	digests, err := ocilayout.Write(dir, ocilayout.Image{Name: "x", Config: ocispec.ImageConfig{Cmd: []string{"/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadImage(dir, "ghcr.io/example/x@"+digests[0].String()); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadImage(dir, "ghcr.io/example/x@sha256:"+strings.Repeat("1", 64)); err == nil || !strings.Contains(err.Error(), "the layout holds another image") {
		t.Errorf("a pin of another image: %v", err)
	}
	if _, err := LoadImage(t.TempDir(), "x"); err == nil || !strings.Contains(err.Error(), "not an OCI image layout") {
		t.Errorf("an empty directory: %v", err)
	}
}

// Whiteouts delete /etc/passwd; an opaque /etc drops both files.
func TestUserDBWhiteouts(t *testing.T) {
	for name, c := range map[string]struct {
		layers        []map[string]string
		uid, gid      uint32
		userErr       string
		resolveAsUser string
	}{
		"deleted":   {layers: []map[string]string{{"etc/passwd": passwd}, {"etc/.wh.passwd": ""}}, resolveAsUser: "app", userErr: "not in the image's /etc/passwd"},
		"opaque":    {layers: []map[string]string{{"etc/passwd": passwd, "etc/group": "g:x:1:\n"}, {"etc/.wh..wh..opq": "", "etc/hosts": ""}}, resolveAsUser: "1001", uid: 1001, gid: 0},
		"readded":   {layers: []map[string]string{{"etc/passwd": "x:x:1:1::/:/\n"}, {"etc/.wh..wh..opq": "", "etc/passwd": passwd}}, resolveAsUser: "1001", uid: 1001, gid: 1002},
		"uid:group": {layers: []map[string]string{{"etc/group": "staff:x:50:\n"}}, resolveAsUser: "7:staff", uid: 7, gid: 50},
		"no group":  {layers: []map[string]string{{"etc/group": "staff:x:50:\n"}}, resolveAsUser: "7:wheel", userErr: `group "wheel" is not in the image's /etc/group`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := ocilayout.Write(dir, ocilayout.Image{Name: "x", Layers: c.layers}); err != nil {
				t.Fatal(err)
			}
			img, err := LoadImage(dir, "x")
			if err != nil {
				t.Fatal(err)
			}
			u, _, err := resolveUser(c.resolveAsUser, img)
			if c.userErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.userErr) {
					t.Fatalf("resolveUser(%s) = %+v, %v; want %q", c.resolveAsUser, u, err, c.userErr)
				}
				return
			}
			if err != nil || u.uid != c.uid || u.gid != c.gid {
				t.Fatalf("resolveUser(%s) = %+v, %v; want %d:%d", c.resolveAsUser, u, err, c.uid, c.gid)
			}
		})
	}
}

// resolveUser without an image: numbers pass, a uid alone gets group 0
// (assumed), a name is refused.
func TestResolveUserWithoutImage(t *testing.T) {
	if u, assumed, err := resolveUser("5:6", nil); err != nil || assumed || u.uid != 5 || u.gid != 6 {
		t.Errorf("5:6 = %+v, %v, %v", u, assumed, err)
	}
	if u, assumed, err := resolveUser("5", nil); err != nil || !assumed || u.uid != 5 || u.gid != 0 {
		t.Errorf("5 = %+v, %v, %v", u, assumed, err)
	}
	if _, _, err := resolveUser("app", nil); err == nil || !strings.Contains(err.Error(), "--image") {
		t.Errorf("app = %v", err)
	}
	if _, _, err := resolveUser("a:b:c", nil); err == nil {
		t.Error("a:b:c accepted")
	}
}
