package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// resolveInRoot follows a root's symlinks as a lookup in the root does,
// never above it.
func TestResolveInRoot(t *testing.T) {
	root := t.TempDir()
	for dir, links := range map[string]map[string]string{
		"":          {"var/run": "../run", "abs": "/etc", "up": "../../../../etc", "loop": "loop2", "loop2": "loop"},
		"run":       {"here": ".", "back": "../var/run/x"},
		"etc/nginx": {"conf": "/srv/conf"},
	} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, target := range links {
			p := filepath.Join(root, dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, d := range []string{"run/secrets", "var/lib", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for in, want := range map[string]string{
		"/var/run/secrets/kubernetes.io/serviceaccount": "/run/secrets/kubernetes.io/serviceaccount",
		"/var/lib/x":                 "/var/lib/x",
		"/abs/hosts":                 "/etc/hosts",
		"/up/hosts":                  "/etc/hosts", // never above the root
		"/run/here/here/secrets":     "/run/secrets",
		"/run/back":                  "/run/x", // a link through another link
		"/etc/nginx/conf/site":       "/srv/conf/site",
		"/missing/var/run":           "/missing/var/run",
		"/loop/x":                    "/loop/x", // crun fails on it: left as written
		"/":                          "/",
		"var/run/../run/secrets/../": "/run",
	} {
		if got := resolveInRoot(root, in); got != want {
			t.Errorf("resolveInRoot(%q) = %q, want %q", in, got, want)
		}
	}
}
