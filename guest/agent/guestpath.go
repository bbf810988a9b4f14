package agent

import (
	"os"
	"path/filepath"
	"strings"

	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
)

// guestLstat and guestReadlink are the only looks guestBindSourceExists
// takes at the guest's filesystem (tests watch them).
var (
	guestLstat    = os.Lstat
	guestReadlink = os.Readlink
)

// ownDirs are the agent's own directories: its state (the containers'
// bundles, roots and staged shares), the pod's virtio-fs share, secrets,
// emptyDirs, layers, images and the mesh's files. The host never makes
// the agent look below them (guestBindSourceExists).
func (s *Service) ownDirs() []string {
	dirs := []string{filepath.Dir(filepath.Clean(s.cfg.StateDir)), s.cfg.StateDir, s.cfg.SharedDir,
		s.cfg.SecretsDir, s.cfg.EmptyDirDir, s.layersDir(), s.imagesDir(), meshapi.Dir}
	out := dirs[:0]
	for _, d := range dirs {
		if d != "" && filepath.IsAbs(d) {
			out = append(out, filepath.Clean(d))
		}
	}
	return out
}

// guestBindSourceExists reports whether p, the source of a bind of the
// guest's own filesystem, exists in the guest: spec.Adapt drops one that
// does not (a host path the guest lacks). The host chooses p, and a look
// is not harmless: walking through an entry of the pod's virtio-fs share
// that the host announces as a mount point mounts it, writable, in the
// agent's mount namespace, where a later stage of that share would pick
// it up. So p is resolved here one component at a time, each symbolic
// link read and followed by hand, and a path that reaches one of the
// agent's own directories (own) is not looked at at all: it is reported
// as existing, kept as written, for the pod's policy to judge (which
// refuses a guest bind it does not name, and names none there by
// default). A path that is not absolute is kept as written too.
func guestBindSourceExists(p string, own []string) bool {
	if !filepath.IsAbs(p) {
		return true
	}
	w := walkLinks("/", p, guestLstat, guestReadlink, func(next string) bool { return within(next, own) })
	return w.stopped || !w.missing && !w.loop
}

// within reports whether p is one of dirs or below one.
func within(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") || d == "/" {
			return true
		}
	}
	return false
}
