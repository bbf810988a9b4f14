package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNodeAgentNeedsANodeName(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	err := tool.Run(context.Background(), "node-agent", []string{"--root", t.TempDir(), "--once"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Fatalf("err = %v, want one naming NODE_NAME", err)
	}
}

func TestNodeAgentBadKubeconfig(t *testing.T) {
	err := tool.Run(context.Background(), "node-agent", []string{"--root", t.TempDir(), "--once", "--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/kubeconfig") {
		t.Fatalf("err = %v, want one naming the kubeconfig", err)
	}
}

func TestTrustBundleSignVerify(t *testing.T) {
	dir := t.TempDir()
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(priv)
	pubDER, _ := x509.MarshalPKIXPublicKey(priv.Public())
	keyFile, pubFile := filepath.Join(dir, "owner.pem"), filepath.Join(dir, "owner.pub")
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
	bundle := filepath.Join(dir, "bundle.json")
	os.WriteFile(bundle, []byte(`{"serial": 3, "revoked": {"tcb_versions": ["0x7308000000000003"]}}`), 0o644)
	var jws bytes.Buffer
	if err := tool.Run(context.Background(), "trust-bundle", []string{"sign", "--key", keyFile, bundle}, &jws); err != nil {
		t.Fatal(err)
	}
	signed := filepath.Join(dir, "bundle.jws")
	os.WriteFile(signed, jws.Bytes(), 0o644)
	var out bytes.Buffer
	if err := tool.Run(context.Background(), "trust-bundle", []string{"verify", "--key", pubFile, signed}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"serial": 3`) || !strings.Contains(out.String(), `"0x7308000000000003"`) {
		t.Errorf("verified bundle:\n%s", out.String())
	}
	// Another key does not verify it.
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	otherDER, _ := x509.MarshalPKIXPublicKey(other)
	os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: otherDER}), 0o644)
	if err := tool.Run(context.Background(), "trust-bundle", []string{"verify", "--key", pubFile, signed}, &out); err == nil || !strings.Contains(err.Error(), "none of the 1 owner key") {
		t.Errorf("verified with another key: %v", err)
	}
}

func TestNodeAgentReattestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--reattest-on-failure", "kill"}, "--reattest-on-failure"},
		{[]string{"--trust-bundle-key", "/nonexistent/owner.pub", "--trust-bundle", "/x"}, "/nonexistent/owner.pub"},
		{[]string{"--trust-bundle", "/x"}, "owner key"},
		{[]string{"--trust-bundle-configmap", "nonamespace"}, "NAMESPACE/NAME"},
		{[]string{"--reattest-interval", "0", "--trust-bundle", "/x"}, "--reattest-interval"},
	} {
		args := append([]string{"--root", t.TempDir(), "--once", "--node-name", "n1", "--kubeconfig", writeKubeconfig(t)}, c.args...)
		err := tool.Run(context.Background(), "node-agent", args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}

// writeKubeconfig writes a kubeconfig of an API server that is not there:
// the node agent's flags are checked before it is reached.
func writeKubeconfig(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(p, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\nusers:\n- name: u\n  user: {token: x}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"), 0o600)
	return p
}
