package layer

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"
)

// entry is one entry of a test tar.
type entry struct {
	hdr  tar.Header
	data []byte
}

// tarOf writes entries as a tar (Go's writer: USTAR, or PAX where
// needed).
func tarOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if h.ModTime.IsZero() && h.Typeflag != tar.TypeXGlobalHeader {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func dir(name string, mode int64) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode}}
}

func file(name string, mode int64, data string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode}, data: []byte(data)}
}

// referenceEntries are the reference vector's layer: every kind of entry a
// layer holds, whiteouts, an opaque directory, xattrs, ids above 16 bits,
// sub-second and pre-1970 times, a name longer than USTAR's, a file over
// one block and one of many.
func referenceEntries() []entry {
	big := make([]byte, 3*BlockSize+17)
	r := rand.NewChaCha8([32]byte{'c', '8', 's'})
	_, _ = r.Read(big)
	long := "usr/share/" + string(bytes.Repeat([]byte("long-name-"), 12)) + "/file"
	return []entry{
		dir("./", 0o755),
		dir("bin/", 0o755),
		{hdr: tar.Header{Name: "bin/app", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 0, Gid: 0,
			PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}},
			data: []byte("#!/bin/sh\necho app\n")},
		{hdr: tar.Header{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "/bin/busybox"}},
		{hdr: tar.Header{Name: "bin/app-hardlink", Typeflag: tar.TypeLink, Linkname: "./bin/app"}},
		dir("etc/", 0o755),
		file("etc/passwd", 0o644, "root:x:0:0::/root:/bin/sh\napp:x:100000:100001::/home/app:/bin/sh\n"),
		{hdr: tar.Header{Name: "etc/.wh.shadow", Typeflag: tar.TypeReg}},
		dir("var/", 0o755),
		dir("var/cache/", 0o755),
		{hdr: tar.Header{Name: "var/cache/.wh..wh..opq", Typeflag: tar.TypeReg}},
		file("var/cache/fresh", 0o600, "new"),
		{hdr: tar.Header{Name: "home/app/", Typeflag: tar.TypeDir, Mode: 0o750, Uid: 100000, Gid: 100001,
			ModTime: time.Unix(1700000000, 123456789), Format: tar.FormatPAX, PAXRecords: map[string]string{"SCHILY.xattr.user.note": "kept"}}},
		{hdr: tar.Header{Name: "home/app/data", Typeflag: tar.TypeReg, Mode: 0o640, Uid: 100000, Gid: 100001, ModTime: time.Unix(-86400, 0)}, data: big},
		{hdr: tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
		{hdr: tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o660, Devmajor: 8, Devminor: 0}},
		{hdr: tar.Header{Name: "run/fifo", Typeflag: tar.TypeFifo, Mode: 0o644}},
		file(long, 0o644, "deep"),
		file("empty", 0o644, ""),
		{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"comment": "skipped"}}},
		{hdr: tar.Header{Name: ".wh..wh.plnk", Typeflag: tar.TypeDir, Mode: 0o700}},
	}
}

// memDisk is an in-memory io.ReadWriteSeeker.
type memDisk struct {
	b   []byte
	pos int64
}

func (m *memDisk) Read(p []byte) (int, error) {
	if m.pos >= int64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(p, m.b[m.pos:])
	m.pos += int64(n)
	return n, nil
}

func (m *memDisk) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(p, m.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memDisk) Write(p []byte) (int, error) {
	if end := m.pos + int64(len(p)); end > int64(len(m.b)) {
		m.b = append(m.b, make([]byte, end-int64(len(m.b)))...)
	}
	n := copy(m.b[m.pos:], p)
	m.pos += int64(n)
	return n, nil
}

func (m *memDisk) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		off += m.pos
	case io.SeekEnd:
		off += int64(len(m.b))
	}
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	m.pos = off
	return off, nil
}
