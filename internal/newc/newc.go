// Package newc writes cpio archives in the "newc" (SVR4, no CRC) format the
// Linux kernel unpacks as an initramfs. Every field that could carry host
// state (inode, device, owner, link count, time) is set by the caller or
// normalised, so equal input gives byte-identical archives whatever the file
// system or user that staged the files.
package newc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

const (
	magic   = "070701"
	trailer = "TRAILER!!!"
)

// File type bits of the mode field.
const (
	ModeDir     = 0o040000
	ModeRegular = 0o100000
	ModeSymlink = 0o120000
	ModeCharDev = 0o020000
)

// Entry is one archive member. Name is relative ("init", "usr/bin/runc").
type Entry struct {
	Name         string
	Mode         uint32 // file type bits | permission bits
	MTime        uint32
	Body         []byte // file content, or link target for a symlink
	RdevMajor    uint32 // for device nodes
	RdevMinor    uint32
	UID, GID     uint32
	nlink, inode uint32
}

// Writer writes entries; Close writes the trailer.
type Writer struct {
	w      *bufio.Writer
	offset int64
	inode  uint32
	err    error
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriter(w)}
}

// Write appends e. Inode numbers are assigned in write order and link counts
// are 2 for directories and 1 otherwise.
func (w *Writer) Write(e Entry) error {
	if w.err != nil {
		return w.err
	}
	if e.Name == "" || strings.HasPrefix(e.Name, "/") || strings.Contains("/"+e.Name+"/", "/../") {
		return fmt.Errorf("newc: invalid entry name %q", e.Name)
	}
	switch e.Mode &^ 0o7777 {
	case ModeDir:
		e.nlink = 2
		e.Body = nil
	case ModeRegular, ModeSymlink, ModeCharDev:
		e.nlink = 1
	default:
		return fmt.Errorf("newc: %s: unsupported file type %o", e.Name, e.Mode&^0o7777)
	}
	if e.Mode&^0o7777 == ModeCharDev {
		e.Body = nil
	}
	w.inode++
	e.inode = w.inode
	w.entry(e)
	return w.err
}

func (w *Writer) entry(e Entry) {
	name := e.Name + "\x00"
	fields := []uint32{
		e.inode, e.Mode, e.UID, e.GID, e.nlink, e.MTime, uint32(len(e.Body)),
		0, 0, // device of the archived file
		e.RdevMajor, e.RdevMinor,
		uint32(len(name)),
		0, // checksum (unused in newc)
	}
	var hdr strings.Builder
	hdr.WriteString(magic)
	for _, f := range fields {
		fmt.Fprintf(&hdr, "%08X", f)
	}
	w.write([]byte(hdr.String()))
	w.write([]byte(name))
	w.pad()
	w.write(e.Body)
	w.pad()
}

func (w *Writer) write(b []byte) {
	if w.err != nil || len(b) == 0 {
		return
	}
	n, err := w.w.Write(b)
	w.offset += int64(n)
	w.err = err
}

// pad aligns the stream to 4 bytes.
func (w *Writer) pad() {
	if r := w.offset % 4; r != 0 {
		w.write(make([]byte, 4-r))
	}
}

// Close writes the trailer and flushes. It does not close the underlying
// writer.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	w.entry(Entry{Name: trailer, nlink: 1})
	if w.err != nil {
		return w.err
	}
	return w.w.Flush()
}

// WriteTree writes every file, directory and symlink below root (not root
// itself) in byte-wise sorted path order, owned by root with mtime set to
// mtime. Permission bits are kept. Other file types are refused.
func WriteTree(w *Writer, root string, mtime uint32) error {
	var paths []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != root {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			paths = append(paths, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(paths)
	for _, rel := range paths {
		path := filepath.Join(root, rel)
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		e := Entry{Name: rel, MTime: mtime, Mode: uint32(info.Mode().Perm())}
		if info.Mode()&os.ModeSticky != 0 {
			e.Mode |= 0o1000
		}
		if info.Mode()&os.ModeSetuid != 0 {
			e.Mode |= 0o4000
		}
		if info.Mode()&os.ModeSetgid != 0 {
			e.Mode |= 0o2000
		}
		switch {
		case info.IsDir():
			e.Mode |= ModeDir
		case info.Mode().IsRegular():
			e.Mode |= ModeRegular
			if e.Body, err = os.ReadFile(path); err != nil {
				return err
			}
		case info.Mode()&os.ModeSymlink != 0:
			e.Mode |= ModeSymlink
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			e.Body = []byte(target)
		default:
			return fmt.Errorf("newc: %s: unsupported file type %v (add device nodes with Writer.Write)", path, info.Mode().Type())
		}
		if err := w.Write(e); err != nil {
			return err
		}
	}
	return nil
}

// ErrTruncated is returned by ReadAll for an archive that ends early.
var ErrTruncated = errors.New("newc: truncated archive")

// ReadAll reads the entries of one archive up to its trailer. It exists to
// inspect archives in tests and tools; it accepts only what Writer writes.
func ReadAll(r io.Reader) ([]Entry, error) {
	br := &countingReader{r: bufio.NewReader(r)}
	var entries []Entry
	for {
		hdr := make([]byte, 6+13*8)
		if err := br.full(hdr); err != nil {
			return nil, err
		}
		if string(hdr[:6]) != magic {
			return nil, fmt.Errorf("newc: bad magic %q at offset %d", hdr[:6], br.n-int64(len(hdr)))
		}
		var f [13]uint32
		for i := range f {
			if _, err := fmt.Sscanf(string(hdr[6+8*i:6+8*i+8]), "%08X", &f[i]); err != nil {
				return nil, fmt.Errorf("newc: bad header field %d: %w", i, err)
			}
		}
		name := make([]byte, f[11])
		if err := br.full(name); err != nil {
			return nil, err
		}
		if err := br.align(); err != nil {
			return nil, err
		}
		if len(name) == 0 || name[len(name)-1] != 0 {
			return nil, errors.New("newc: entry name is not NUL-terminated")
		}
		e := Entry{
			Name: string(name[:len(name)-1]), inode: f[0], Mode: f[1], UID: f[2], GID: f[3],
			nlink: f[4], MTime: f[5], RdevMajor: f[9], RdevMinor: f[10],
		}
		if f[6] > 1<<30 {
			return nil, fmt.Errorf("newc: %s: size %d too large", e.Name, f[6])
		}
		e.Body = make([]byte, f[6])
		if err := br.full(e.Body); err != nil {
			return nil, err
		}
		if err := br.align(); err != nil {
			return nil, err
		}
		if e.Name == trailer {
			return entries, nil
		}
		entries = append(entries, e)
	}
}

// Links returns the link count recorded for e (set by Write or ReadAll).
func (e Entry) Links() uint32 { return e.nlink }

type countingReader struct {
	r *bufio.Reader
	n int64
}

func (c *countingReader) full(b []byte) error {
	n, err := io.ReadFull(c.r, b)
	c.n += int64(n)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return ErrTruncated
	}
	return err
}

func (c *countingReader) align() error {
	if r := c.n % 4; r != 0 {
		return c.full(make([]byte, 4-r))
	}
	return nil
}
