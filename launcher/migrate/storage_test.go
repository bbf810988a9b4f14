package migrate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/vm"
)

// The destination opens only disks below migration.shared_storage_root,
// links resolved, and names the path and the root when it refuses one.
func TestCheckDiskPaths(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "shared")
	outside := filepath.Join(base, "private")
	for _, d := range []string{filepath.Join(root, "pods", "p1"), outside} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string) string {
		if err := os.WriteFile(p, []byte("disk"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(target, p string) string {
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inside := write(filepath.Join(root, "pods", "p1", "rootfs.img"))
	secret := write(filepath.Join(outside, "secret.img"))
	linkIn := link(inside, filepath.Join(base, "via-link.img"))                        // outside path, inside target
	linkOut := link(secret, filepath.Join(root, "pods", "p1", "escape.img"))           // inside path, outside target
	dirLinkOut := link(outside, filepath.Join(root, "pods", "elsewhere"))              // a directory link out
	rootLink := link(root, filepath.Join(base, "shared-link"))                         // the root through a link
	linkToDev := link("/dev/null", filepath.Join(root, "pods", "p1", "null.img"))      // a character device
	linkToDir := link(filepath.Join(root, "pods"), filepath.Join(root, "pods", "dir")) // a directory

	disk := func(p string) []vm.Disk { return []vm.Disk{{ID: "d0", Path: p}} }
	for _, tc := range []struct {
		name, root, path, want, err string
	}{
		{"inside", root, inside, inside, ""},
		{"root given through a link", rootLink, inside, inside, ""},
		{"a link from outside to inside", root, linkIn, inside, ""},
		{"no root configured", "", inside, "", "no migration.shared_storage_root"},
		{"outside", root, secret, "", "outside the shared storage root"},
		{"a link inside pointing outside", root, linkOut, "", "resolves to " + secret + ", outside"},
		{"a directory link out", root, filepath.Join(dirLinkOut, "secret.img"), "", "outside the shared storage root"},
		{"dot-dot", root, filepath.Join(root, "pods", "p1") + "/../p1/rootfs.img", "", `".." element`},
		{"dot-dot escaping", root, root + "/../private/secret.img", "", `".." element`},
		{"relative", root, "pods/p1/rootfs.img", "", "not absolute"},
		{"the root itself", root, root, "", "outside the shared storage root"},
		{"a character device", root, linkToDev, "", "outside the shared storage root"},
		{"a directory", root, linkToDir, "", "neither a regular file nor a block device"},
		{"missing", root, filepath.Join(root, "nope.img"), "", "no such file"},
		{"/etc/shadow", root, "/etc/shadow", "", "outside the shared storage root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := checkDiskPaths(tc.root, disk(tc.path))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("checkDiskPaths(%s, %s) = %v, %v; want an error with %q", tc.root, tc.path, got, err, tc.err)
				}
				if !strings.Contains(err.Error(), tc.path) || (tc.root != "" && !strings.Contains(err.Error(), tc.root)) {
					t.Fatalf("the refusal does not name the path %s and the root %s: %v", tc.path, tc.root, err)
				}
				return
			}
			if err != nil || len(got) != 1 || got[0].Path != tc.want || got[0].ID != "d0" {
				t.Fatalf("checkDiskPaths(%s, %s) = %+v, %v; want %s", tc.root, tc.path, got, err, tc.want)
			}
		})
	}
	if got, err := checkDiskPaths("", nil); err != nil || got != nil {
		t.Fatalf("no disks, no root: %v, %v", got, err)
	}
	if _, err := checkDiskPaths(filepath.Join(base, "absent"), disk(inside)); err == nil || !strings.Contains(err.Error(), "migration.shared_storage_root") {
		t.Fatalf("a missing root: %v", err)
	}
}
