//go:build !linux

package main

import (
	"crypto/sha256"
	"os"
)

// sevHashFile streams a file through SHA-256.
func sevHashFile(path string) ([sha256.Size]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	defer file.Close()
	return sevHashStream(file, path)
}
