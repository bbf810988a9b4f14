package agent

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// maxLinks bounds the symbolic links one path may pass through (the
// kernel's MAXSYMLINKS).
const maxLinks = 40

// walked is how far walkLinks resolved a path.
type walked struct {
	// resolved is the path reached, rest the components not reached.
	resolved string
	rest     []string
	// stopped: stop refused resolved+first of rest; missing: it does not
	// exist (or could not be read); loop: more than maxLinks links.
	stopped, missing, loop bool
}

// walkLinks resolves p (absolute) inside root ("/": the guest's own
// tree) as a lookup in root does: one component at a time, each symbolic
// link read and followed by hand, an absolute target from root, ".."
// never above it. stop (nil: none) is asked about each component's path
// before it is looked at, and ends the walk there when it says so.
func walkLinks(root, p string, lstat func(string) (fs.FileInfo, error), readlink func(string) (string, error), stop func(string) bool) walked {
	w := walked{resolved: "/", rest: strings.Split(p, "/")}
	links := 0
	for len(w.rest) > 0 {
		c := w.rest[0]
		switch c {
		case "", ".":
			w.rest = w.rest[1:]
			continue
		case "..":
			w.rest = w.rest[1:]
			w.resolved = path.Dir(w.resolved)
			continue
		}
		next := path.Join(w.resolved, c)
		if stop != nil && stop(next) {
			w.stopped = true
			return w
		}
		fi, err := lstat(filepath.Join(root, next))
		if err != nil {
			w.missing = true
			return w
		}
		w.rest = w.rest[1:]
		if fi.Mode()&fs.ModeSymlink == 0 {
			w.resolved = next
			continue
		}
		if links++; links > maxLinks {
			w.rest, w.loop = append([]string{c}, w.rest...), true
			return w
		}
		target, err := readlink(filepath.Join(root, next))
		if err != nil {
			w.rest, w.missing = append([]string{c}, w.rest...), true
			return w
		}
		if strings.HasPrefix(target, "/") {
			w.resolved = "/"
		}
		w.rest = append(strings.Split(target, "/"), w.rest...)
	}
	return w
}

// resolveInRoot returns p (absolute, in the container) as a lookup inside
// root resolves it, the way crun resolves a mount's destination
// (RESOLVE_IN_ROOT): its existing components' links followed, from the
// first component that does not exist the rest as written (created so).
// A loop leaves the rest as written too (crun fails on it).
func resolveInRoot(root, p string) string {
	w := walkLinks(root, path.Clean("/"+p), os.Lstat, os.Readlink, nil)
	return path.Join(append([]string{w.resolved}, w.rest...)...)
}
