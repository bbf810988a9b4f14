package layer

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
)

// normalizer reads an OCI layer tar and serves, as an io.Reader, the
// normalized tar that tar2ext4 converts (see the package comment). It is
// pulled: each Read parses only as much of the input as it needs, so the
// layer streams through in constant memory and the input is read to its
// end (for the diff ID) once the archive ends.
type normalizer struct {
	raw io.Reader
	tr  *tar.Reader
	tw  *tar.Writer
	buf bytes.Buffer
	// left is the current entry's content not yet copied; budget the file
	// content the layer may still have.
	left, budget int64
	// entry names the entry being written, for errors.
	entry string
	err   error
}

func newNormalizer(raw io.Reader, limit int64) *normalizer {
	n := &normalizer{raw: raw, tr: tar.NewReader(raw), budget: limit}
	n.tw = tar.NewWriter(&n.buf)
	return n
}

// Read serves the normalized tar; its error is the input's (io.EOF once
// the input is read to its end).
func (n *normalizer) Read(p []byte) (int, error) {
	for n.buf.Len() == 0 && n.err == nil {
		n.err = n.step()
	}
	if n.buf.Len() > 0 {
		return n.buf.Read(p)
	}
	return 0, n.err
}

// copyChunk bounds how much content one step copies.
const copyChunk = 256 << 10

// step writes the next piece of the normalized tar into buf: a chunk of
// the current entry's content, or the next entry's header, or the end.
func (n *normalizer) step() error {
	if n.left > 0 {
		k := min(n.left, copyChunk)
		if _, err := io.CopyN(n.tw, n.tr, k); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("entry %q: %w", n.entry, err)
		}
		n.left -= k
		return nil
	}
	h, err := n.tr.Next()
	if err == io.EOF {
		if err := n.tw.Close(); err != nil {
			return err
		}
		// Whatever follows the archive's end (its padding) is part of
		// the layer's bytes.
		if _, err := io.Copy(io.Discard, n.raw); err != nil {
			return err
		}
		return io.EOF
	}
	if err != nil {
		if n.entry != "" {
			return fmt.Errorf("after entry %q: %w", n.entry, err)
		}
		return err
	}
	out, skip, err := normalizeHeader(h)
	if err != nil {
		return err
	}
	if skip {
		return nil
	}
	n.entry = out.Name
	if out.Size > n.budget {
		return fmt.Errorf("entry %q: the layer's files exceed %d bytes, the most a layer disk holds", out.Name, MaxDataSize)
	}
	n.budget -= out.Size
	if err := n.tw.WriteHeader(out); err != nil {
		return fmt.Errorf("entry %q: %w", out.Name, err)
	}
	n.left = out.Size
	return nil
}

// cleanName is name as a path relative to the layer's root, "" for the
// root itself: "/a/../b", "./b" and "b" are all "b".
func cleanName(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

// fsTime is t as the layer disk keeps it: tar2ext4 cannot encode times
// before 1970 (it writes them as dates past 2300, which e2fsck flags), so
// they are written as the epoch.
func fsTime(t time.Time) time.Time {
	if t.IsZero() || t.Unix() >= 0 {
		return t
	}
	return time.Unix(0, 0)
}

// Whiteout names (OCI image spec, layer.md).
const (
	whiteoutPrefix     = ".wh."
	whiteoutMetaPrefix = ".wh..wh."
	whiteoutOpaque     = ".wh..wh..opq"
	xattrPAXPrefix     = "SCHILY.xattr."
)

// normalizeHeader returns the header tar2ext4 gets for h, or skip for an
// entry that is not part of the file system.
func normalizeHeader(h *tar.Header) (out *tar.Header, skip bool, err error) {
	if h.Typeflag == tar.TypeXGlobalHeader {
		return nil, true, nil
	}
	name := cleanName(h.Name)
	bad := func(format string, a ...any) (*tar.Header, bool, error) {
		return nil, false, fmt.Errorf("entry %q: %s", h.Name, fmt.Sprintf(format, a...))
	}
	base := path.Base(name)
	if strings.HasPrefix(base, whiteoutMetaPrefix) && base != whiteoutOpaque {
		return nil, true, nil // AUFS metadata (.wh..wh.plnk, .wh..wh.aufs)
	}
	if h.Uid < 0 || h.Uid > 1<<32-1 || h.Gid < 0 || h.Gid > 1<<32-1 {
		return bad("uid %d or gid %d is not a 32-bit id", h.Uid, h.Gid)
	}
	out = &tar.Header{
		Name:       name,
		Mode:       h.Mode & 0o7777,
		Uid:        h.Uid,
		Gid:        h.Gid,
		ModTime:    fsTime(h.ModTime),
		AccessTime: fsTime(h.AccessTime),
		ChangeTime: fsTime(h.ChangeTime),
		Format:     tar.FormatPAX,
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		if name == "" || base == whiteoutPrefix {
			return bad("a whiteout names no file")
		}
		// tar2ext4 turns it into a whiteout by its name; its content, if
		// any, is not part of the file system.
		out.Typeflag = tar.TypeReg
		return out, false, nil
	}
	if name == "" && h.Typeflag != tar.TypeDir {
		return bad("the layer's root is not a directory")
	}
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse:
		// A sparse file's holes are written out: Size is its logical size.
		out.Typeflag, out.Size = tar.TypeReg, h.Size
	case tar.TypeLink:
		target := cleanName(h.Linkname)
		if target == "" {
			return bad("a hard link to the layer's root")
		}
		out.Typeflag, out.Linkname = tar.TypeLink, target
	case tar.TypeSymlink:
		if h.Linkname == "" {
			return bad("a symbolic link with an empty target")
		}
		out.Typeflag, out.Linkname = tar.TypeSymlink, h.Linkname
	case tar.TypeChar, tar.TypeBlock:
		// ext4 keeps Linux's 12-bit major and 20-bit minor.
		if h.Devmajor < 0 || h.Devmajor >= 1<<12 || h.Devminor < 0 || h.Devminor >= 1<<20 {
			return bad("device %d:%d is not a Linux device number", h.Devmajor, h.Devminor)
		}
		out.Typeflag, out.Devmajor, out.Devminor = h.Typeflag, h.Devmajor, h.Devminor
	case tar.TypeDir, tar.TypeFifo:
		out.Typeflag = h.Typeflag
	default:
		return bad("type %q is not a file a layer may hold", h.Typeflag)
	}
	if out.Name == "" {
		out.Name = "./"
	}
	for k, v := range h.PAXRecords {
		if strings.HasPrefix(k, xattrPAXPrefix) && len(k) > len(xattrPAXPrefix) {
			if out.PAXRecords == nil {
				out.PAXRecords = map[string]string{}
			}
			out.PAXRecords[k] = v
		}
	}
	return out, false, nil
}
