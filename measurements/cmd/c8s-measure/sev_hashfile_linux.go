//go:build linux

package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"runtime/debug"
	"syscall"
)

// sevHashFile hashes a file through a read-only shared mapping of it, which
// spares copying the (often tens of MiB) kernel and initrd out of the page
// cache. It falls back to streaming reads when the file cannot be mapped.
func sevHashFile(path string) ([sha256.Size]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	size := st.Size()
	if !st.Mode().IsRegular() || size == 0 || int64(int(size)) != size {
		return sevHashStream(file, path)
	}
	data, err := syscall.Mmap(int(file.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return sevHashStream(file, path)
	}
	defer syscall.Munmap(data)
	return sevHashMapped(data, path)
}

// sevHashMapped hashes a mapped file. A file truncated while it is hashed
// faults (SIGBUS); that becomes an error rather than a crash.
func sevHashMapped(data []byte, path string) (d [sha256.Size]byte, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reading %s: the file changed while it was hashed (%v)", path, r)
		}
	}()
	return sha256.Sum256(data), nil
}
