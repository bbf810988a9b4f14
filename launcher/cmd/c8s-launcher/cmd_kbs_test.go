package main

import (
	"crypto/tls"
	"io"
	"os"
	"path/filepath"
	"slices"
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

// The broker serves only pods whose init data the owner pinned, and
// refuses to start with a pinned document it would release nothing to.
func TestKBSRequiresPinnedInitData(t *testing.T) {
	dir := t.TempDir()
	base := []string{"--dir", dir, "--cert", filepath.Join(dir, "cert.pem"), "--key", filepath.Join(dir, "key.pem"), "--config", filepath.Join(dir, "missing.toml")}
	err := runKBS(t.Context(), base, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--init-data FILE") || !strings.Contains(err.Error(), "--any-init-data") {
		t.Fatalf("nothing pinned: err = %v, want the pinning flags named", err)
	}
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noPolicy := write("no-policy.toml", "version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	err = runKBS(t.Context(), append(base, "--init-data", noPolicy), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no [policy] section") || !strings.Contains(err.Error(), "c8s-measure policy") {
		t.Fatalf("a document without [policy]: err = %v", err)
	}
	audit := write("audit.toml", "version = \"0.1\"\n[policy]\naudit = true\n")
	if err = runKBS(t.Context(), append(base, "--init-data", audit), io.Discard); err == nil || !strings.Contains(err.Error(), "audit mode") {
		t.Fatalf("a document in audit mode: err = %v", err)
	}
	// Past the pins, to the missing config (read only under the
	// development flag): each flag passes the check.
	base = append(base, "--reference-values-from-node")
	hostRootfs := write("host-rootfs.toml", "version = \"0.1\"\n[policy]\n[policy.containers.app]\nimage = \"x\"\nargs = [\"y\"]\nworking_dir = \"/\"\nuid = 0\ngid = 0\n")
	if err = runKBS(t.Context(), append(slices.Clone(base), "--init-data", hostRootfs), io.Discard); err == nil || !strings.Contains(err.Error(), `rule "app" does not pin its image's layers`) || !strings.Contains(err.Error(), "--allow-host-rootfs-pods") {
		t.Fatalf("a document whose rule pins no layers: err = %v", err)
	}
	enforced := write("pod.toml", "version = \"0.1\"\n[policy]\n[policy.containers.app]\nimage = \"x\"\nargs = [\"y\"]\nworking_dir = \"/\"\nuid = 0\ngid = 0\n"+appLayers)
	for _, extra := range [][]string{
		{"--init-data", enforced, "--init-data", enforced},
		{"--any-init-data"},
		{"--init-data", noPolicy, "--allow-unconfined-host"},
		{"--init-data", hostRootfs, "--allow-host-rootfs-pods"},
	} {
		if err := runKBS(t.Context(), append(slices.Clone(base), extra...), io.Discard); err == nil || !strings.Contains(err.Error(), "missing.toml") {
			t.Errorf("%v: err = %v, want the pins accepted (and the missing config refused)", extra, err)
		}
	}
}

// appLayers pins a rule's image: one layer, by diff ID and dm-verity root.
const appLayers = "layers = [{ digest = \"sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef\", verity = \"9c3a0f6e4bd1c2a3e4f5061728394a5b6c7d8e9f00112233445566778899aabb\", blocks = 1187 }]\n"
