// Command mkinitramfs writes a staged directory tree as an uncompressed newc
// cpio archive for the kernel, deterministically: sorted paths, root owner,
// one mtime, normalised inode numbers and link counts. Device nodes, which an
// unprivileged build cannot create in the tree, are added with -chardev.
//
//	mkinitramfs -root DIR -o OUT.cpio [-mtime EPOCH] [-chardev dev/console:0600:5:1]...
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/c8s-dev/c8s/internal/newc"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkinitramfs:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkinitramfs", flag.ContinueOnError)
	root := fs.String("root", "", "staged tree to archive (required)")
	out := fs.String("o", "", "output file (required)")
	mtime := fs.Uint("mtime", 0, "modification time of every entry (SOURCE_DATE_EPOCH)")
	var devs []newc.Entry
	fs.Func("chardev", "PATH:MODE:MAJOR:MINOR character device to add (repeatable)", func(v string) error {
		e, err := parseCharDev(v)
		if err == nil {
			devs = append(devs, e)
		}
		return err
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *root == "" || *out == "" || fs.NArg() != 0 {
		return fmt.Errorf("usage: mkinitramfs -root DIR -o OUT.cpio [-mtime N] [-chardev PATH:MODE:MAJOR:MINOR]")
	}
	if *mtime > 1<<32-1 {
		return fmt.Errorf("-mtime %d does not fit the 32-bit cpio field", *mtime)
	}
	var buf bytes.Buffer
	w := newc.NewWriter(&buf)
	if err := newc.WriteTree(w, *root, uint32(*mtime)); err != nil {
		return err
	}
	for _, d := range devs {
		d.MTime = uint32(*mtime)
		if err := w.Write(d); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(*out, buf.Bytes(), 0o644)
}

func parseCharDev(v string) (newc.Entry, error) {
	parts := strings.Split(v, ":")
	if len(parts) != 4 {
		return newc.Entry{}, fmt.Errorf("-chardev %q: want PATH:MODE:MAJOR:MINOR", v)
	}
	var nums [3]uint64
	for i, p := range parts[1:] {
		base := 10
		if i == 0 {
			base = 8
		}
		n, err := strconv.ParseUint(p, base, 32)
		if err != nil {
			return newc.Entry{}, fmt.Errorf("-chardev %q: %w", v, err)
		}
		nums[i] = n
	}
	if nums[0] > 0o7777 {
		return newc.Entry{}, fmt.Errorf("-chardev %q: mode %o has more than permission bits", v, nums[0])
	}
	return newc.Entry{
		Name:      strings.TrimPrefix(parts[0], "/"),
		Mode:      newc.ModeCharDev | uint32(nums[0]),
		RdevMajor: uint32(nums[1]),
		RdevMinor: uint32(nums[2]),
	}, nil
}
