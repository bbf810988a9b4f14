package main

import (
	"crypto/tls"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKBSEnsureCert(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := ensureCert(cert, key, []string{"127.0.0.1", "kbs.example"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatalf("the created files are not a key pair: %v", err)
	}
	if pair.Leaf == nil || pair.Leaf.VerifyHostname("kbs.example") != nil || pair.Leaf.VerifyHostname("127.0.0.1") != nil {
		t.Fatal("the certificate does not name the given hosts")
	}
	before, _ := os.ReadFile(cert)
	if err := ensureCert(cert, key, []string{"other"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(cert); string(after) != string(before) {
		t.Fatal("an existing certificate was replaced")
	}
	os.Remove(key)
	if err := ensureCert(cert, key, nil, io.Discard); err == nil || !strings.Contains(err.Error(), "both") {
		t.Fatalf("a certificate without its key: err = %v", err)
	}
}
