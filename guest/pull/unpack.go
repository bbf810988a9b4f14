package pull

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Whiteout names (OCI image spec, layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// xattrPrefix marks a PAX record of an extended attribute.
const xattrPrefix = "SCHILY.xattr."

// unpack applies one layer's tar to the directory root: entries are
// created, whiteouts remove what the layers below have, an opaque
// directory loses everything of theirs. Every path is resolved inside
// root (openat2 RESOLVE_IN_ROOT: a symlink of the image, absolute or
// not, cannot lead out of it), a name with ".." that climbs above the
// root is refused, device nodes are not created, and only the extended
// attributes security.capability and user.* are kept (never overlayfs's,
// which would change how the guest stacks the directory).
func unpack(r io.Reader, root string) error {
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rootfd)
	u := &unpacker{root: rootfd, layer: map[string]bool{}}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the layer's tar: %w", err)
		}
		if err := u.entry(h, tr); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
	}
	for _, d := range u.dirs {
		u.times(d.path, d.h)
	}
	return nil
}

type unpacker struct {
	root  int
	layer map[string]bool // the paths this layer wrote
	dirs  []dirEntry      // directories, whose times are set last
	// Skipped counts device nodes not created.
	skipped int
}

type dirEntry struct {
	path string
	h    *tar.Header
}

// cleanName returns the entry's path relative to the root ("" for the
// root itself), refusing one that climbs out of it.
func cleanName(n string) (string, error) {
	p := path.Clean("/" + n)
	if strings.Contains(n, "\x00") {
		return "", errors.New("a NUL in the name")
	}
	// "/"+n cleaned cannot hold "..", but a name with ".." climbing
	// above the root says the layer is built to escape: refuse it.
	depth := 0
	for _, c := range strings.Split(n, "/") {
		switch c {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return "", errors.New("path traversal: the name climbs out of the image's root")
			}
		default:
			depth++
		}
	}
	return strings.TrimPrefix(p, "/"), nil
}

func (u *unpacker) entry(h *tar.Header, r io.Reader) error {
	p, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	if p == "" {
		return nil // the root directory: its metadata is the layer's dir's
	}
	dir, base := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	switch {
	case base == whiteoutOpaque:
		return u.opaque(dir)
	case strings.HasPrefix(base, whiteoutMeta):
		return nil // other AUFS metadata
	case strings.HasPrefix(base, whiteoutPrefix):
		target := base[len(whiteoutPrefix):]
		if target == "" || target == "." || target == ".." {
			return errors.New("a whiteout of no name")
		}
		pfd, err := u.openDir(dir, false)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		return removeAt(pfd, target)
	}
	switch h.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		// Containers get /dev from their runtime; the image's directory
		// is mounted nodev all the same.
		u.skipped++
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		return nil // pax and GNU metadata the reader has applied, sparse files (none in OCI layers)
	}
	pfd, err := u.openDir(dir, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	exists := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	if exists && !(h.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR) {
		if err := removeAt(pfd, base); err != nil {
			return err
		}
		exists = false
	}
	mode := uint32(h.Mode & 0o7777)
	var fd = -1
	switch h.Typeflag {
	case tar.TypeDir:
		if !exists {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return err
			}
		}
		if fd, err = unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
	case tar.TypeReg:
		if fd, err = unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600); err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), base)
		_, err := io.CopyN(f, r, h.Size)
		if err != nil {
			f.Close()
			return fmt.Errorf("write: %w", err)
		}
		// f owns fd: reopen one for the metadata below.
		fd, err = unix.Dup(fd)
		f.Close()
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
			return err
		}
	case tar.TypeLink:
		t, err := cleanName(h.Linkname)
		if err != nil || t == "" {
			return fmt.Errorf("hard link to %q: %v", h.Linkname, err)
		}
		tdir, tbase := path.Split(t)
		tfd, err := u.openDir(strings.TrimSuffix(tdir, "/"), false)
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", h.Linkname, err)
		}
		err = unix.Linkat(tfd, tbase, pfd, base, 0)
		unix.Close(tfd)
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", h.Linkname, err)
		}
		u.layer[p] = true
		return nil // a link shares its target's metadata
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return err
		}
	}
	u.layer[p] = true
	if fd >= 0 {
		defer unix.Close(fd)
		if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
			return fmt.Errorf("owner: %w", err)
		}
		// After the owner: chown clears the set-ID bits.
		if err := unix.Fchmod(fd, mode); err != nil {
			return fmt.Errorf("mode: %w", err)
		}
		for k, v := range h.PAXRecords {
			name, ok := strings.CutPrefix(k, xattrPrefix)
			if !ok || !(name == "security.capability" || strings.HasPrefix(name, "user.")) {
				continue
			}
			if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
				return fmt.Errorf("extended attribute %s: %w", name, err)
			}
		}
	} else {
		if err := unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("owner: %w", err)
		}
		if h.Typeflag == tar.TypeFifo {
			if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
				return fmt.Errorf("mode: %w", err)
			}
		}
	}
	if h.Typeflag == tar.TypeDir {
		u.dirs = append(u.dirs, dirEntry{path: p, h: h})
		return nil
	}
	ts := []unix.Timespec{unix.NsecToTimespec(h.AccessTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	if h.AccessTime.IsZero() {
		ts[0] = ts[1]
	}
	_ = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	return nil
}

// times sets a directory's times, once its entries are written.
func (u *unpacker) times(p string, h *tar.Header) {
	fd, err := u.openDir(p, false)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	_ = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
}

// openDir opens directory p of the root (O_PATH), resolved inside it;
// create makes what is missing of it.
func (u *unpacker) openDir(p string, create bool) (int, error) {
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	if p == "" {
		return unix.Dup(u.root)
	}
	fd, err := unix.Openat2(u.root, p, how)
	if err == nil || !create || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	// Make the missing directories, each resolved inside the root.
	parts := strings.Split(p, "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		fd, err := unix.Openat2(u.root, prefix, how)
		if err == nil {
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return -1, err
		}
		pfd, err := u.openDir(strings.Join(parts[:i], "/"), false)
		if err != nil {
			return -1, err
		}
		err = unix.Mkdirat(pfd, parts[i], 0o755)
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
	}
	return unix.Openat2(u.root, p, how)
}

// opaque removes what the layers below have in directory p.
func (u *unpacker) opaque(p string) error {
	pfd, err := u.openDir(p, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), p)
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if u.layer[path.Join(p, n)] {
			continue
		}
		if err := removeAt(pfd, n); err != nil {
			return err
		}
	}
	return nil
}

// removeAt removes name in directory dirfd, a directory with all it
// holds; it is not an error if there is none.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			d.Close()
			return err
		}
	}
	d.Close()
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}
