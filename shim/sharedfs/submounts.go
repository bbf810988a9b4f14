package sharedfs

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// MaxSubmounts bounds the submounts reported for one shared path (the
// agent takes no more).
const MaxSubmounts = 64

// Submounts returns the mount points strictly below hostPath (its
// symbolic links resolved, as a bind mount resolves them) in this mount
// namespace, relative to it: shallowest first, at most MaxSubmounts.
// virtio-fs announces them to the guest, which mounts each on first
// lookup; the agent looks them up before it binds the path, so that a
// read-only bind of it (not recursive) leaves them as they are here.
func Submounts(hostPath string) ([]string, error) {
	real, err := filepath.EvalSymlinks(hostPath)
	if err != nil {
		return nil, fmt.Errorf("sharedfs: %w", err)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("sharedfs: %w", err)
	}
	defer f.Close()
	return submountsIn(f, real)
}

// submountsIn reads mountinfo for the mount points below dir.
func submountsIn(mountinfo io.Reader, dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	prefix := dir + "/"
	if dir == "/" {
		prefix = "/"
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(mountinfo)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if !strings.HasPrefix(mp, prefix) || mp == dir {
			continue
		}
		seen[strings.TrimPrefix(mp, prefix)] = true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("sharedfs: read mountinfo: %w", err)
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b string) int {
		if c := cmp.Compare(strings.Count(a, "/"), strings.Count(b, "/")); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	if len(out) > MaxSubmounts {
		out = out[:MaxSubmounts]
	}
	return out, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space,
// \011, \012, \134).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
