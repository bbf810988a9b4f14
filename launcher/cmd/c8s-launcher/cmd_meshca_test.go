package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The mesh-ca command builds the CA from the owner's files only: the
// resource policy's [mesh] section, the CA's key (created once, then
// read), and refuses what would let it issue to anyone.
func TestMeshCAFlags(t *testing.T) {
	e := newOwnerEnv(t)
	ref := e.write(t, "owner.json", string(manifestFor(t, e.measurement[:])))
	policy := e.write(t, "mesh.toml", `
[workloads.app]
init_data = ["`+strings.Repeat("ab", 32)+`"]
[mesh]
trust_domain = "c8s.test"
[[mesh.identities]]
namespace = "default"
service_account = "app"
workloads = ["app"]
`)
	o := kbsFlags{tee: "sim", simDir: e.spDir, referenceValues: stringList{ref}, resourcePolicy: policy}
	m := meshCAFlags{caCert: filepath.Join(e.dir, "ca.pem"), caKey: filepath.Join(e.dir, "ca-key.pem"), lifetime: time.Minute}
	var out bytes.Buffer
	ca, tee, err := newMeshCA(o, m, &out)
	if err != nil {
		t.Fatal(err)
	}
	if tee != "sim" || ca.trustDomain != "c8s.test" || ca.Lifetime != time.Minute || !strings.Contains(out.String(), "created a mesh CA") {
		t.Fatalf("tee %q, trust domain %q, lifetime %v, output %q", tee, ca.trustDomain, ca.Lifetime, out.String())
	}
	certPEM, _ := os.ReadFile(m.caCert)
	again, _, err := newMeshCA(o, m, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(m.caCert); !bytes.Equal(got, certPEM) || !again.Cert.Equal(ca.Cert) {
		t.Fatal("a second start made a new CA instead of reading the existing one")
	}
	// One of the two files missing: refused rather than overwritten.
	if err := os.Remove(m.caKey); err != nil {
		t.Fatal(err)
	}
	if _, _, err := newMeshCA(o, m, io.Discard); err == nil || !strings.Contains(err.Error(), "give both existing files") {
		t.Fatalf("a missing CA key: err = %v", err)
	}
	// A resource policy without [mesh] gives no identities.
	o.resourcePolicy = e.write(t, "resources.toml", "[workloads.app]\ninit_data = [\""+strings.Repeat("ab", 32)+"\"]\n[[resources]]\npath = \"default/key/x\"\nworkloads = [\"app\"]\n")
	if _, _, err := newMeshCA(o, m, io.Discard); err == nil || !strings.Contains(err.Error(), "no [mesh] section") {
		t.Fatalf("no [mesh]: err = %v", err)
	}
	for args, want := range map[string]string{
		"--cert c --key k --ca-cert a --ca-key b": "--resource-policy is required",
		"--cert c --key k":                        "are required",
		"--cert c --key k --ca-cert a --ca-key b --resource-policy p --lifetime 1s": "at least 10s",
	} {
		if err := runMeshCA(context.Background(), strings.Fields(args), io.Discard); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("mesh-ca %s: err = %v, want %q", args, err, want)
		}
	}
}
