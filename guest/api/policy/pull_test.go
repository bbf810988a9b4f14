package policy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"
)

const testDigest = "sha256:0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e"

func TestParsePullRef(t *testing.T) {
	for ref, want := range map[string]PullRef{
		"registry:5000/repo/app@" + testDigest:   {"registry:5000", "repo/app", testDigest},
		"10.0.0.1:5000/app@" + testDigest:        {"10.0.0.1:5000", "app", testDigest},
		"localhost/app@" + testDigest:            {"localhost", "app", testDigest},
		"debian@" + testDigest:                   {"index.docker.io", "library/debian", testDigest},
		"docker.io/library/debian@" + testDigest: {"index.docker.io", "library/debian", testDigest},
		"user/app@" + testDigest:                 {"index.docker.io", "user/app", testDigest},
	} {
		got, err := ParsePullRef(ref)
		if err != nil || got != want {
			t.Errorf("ParsePullRef(%q) = %+v, %v; want %+v", ref, got, err, want)
		}
	}
	for ref, wantErr := range map[string]string{
		"registry:5000/app:1.0":                            "not pinned by digest",
		"registry:5000/app":                                "not pinned by digest",
		"registry:5000/app:1.0@" + testDigest:              "names a tag",
		"registry:5000/app@sha256:abc":                     "not sha256:<64",
		"registry:5000/app@sha512:" + testDigest[7:]:       "not sha256:<64",
		"registry:5000/App@" + testDigest:                  "not valid",
		"registry:5000/../app@" + testDigest:               "not valid",
		"registry:5000/app@" + strings.ToUpper(testDigest): "not sha256:<64",
	} {
		if _, err := ParsePullRef(ref); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("ParsePullRef(%q) = %v, want an error with %q", ref, err, wantErr)
		}
	}
}

// Validate refuses a tag, credentials over plain HTTP and malformed
// broker resources, naming the key.
func TestValidatePull(t *testing.T) {
	rule := func(pull, auth string, plain bool) *Container {
		wd := Pattern("/")
		var id uint32
		return &Container{Image: "x", Args: []Pattern{"/app"}, WorkingDir: &wd, UID: &id, GID: &id, Pull: pull, PullAuth: auth, PullPlainHTTP: plain}
	}
	ok := "registry:5000/app@" + testDigest
	for name, c := range map[string]struct {
		rule *Container
		err  string // "" if valid
	}{
		"pinned":                {rule(ok, "", false), ""},
		"pinned, credentials":   {rule(ok, "kbs:///default/registry/auth", false), ""},
		"pinned, plain HTTP":    {rule(ok, "", true), ""},
		"tag":                   {rule("registry:5000/app:latest", "", false), "policy.containers.app.pull: \"registry:5000/app:latest\" is not pinned by digest"},
		"credentials over HTTP": {rule(ok, "kbs:///default/registry/auth", true), "policy.containers.app.pull_auth: credentials are never sent over plain HTTP"},
		"bad resource":          {rule(ok, "kbs:///default/auth", false), "policy.containers.app.pull_auth: \"kbs:///default/auth\": want kbs:///REPO/TYPE/TAG"},
		"auth without pull":     {rule("", "kbs:///default/registry/auth", false), "policy.containers.app.pull_auth: set without pull"},
	} {
		err := (&Policy{Containers: map[string]*Container{"app": c.rule}}).Validate(nil)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: err = %v, want %q", name, err, c.err)
		}
	}
	sb := &Policy{Sandbox: rule(ok, "", false)}
	if err := sb.Validate(nil); err == nil || !strings.Contains(err.Error(), "policy.sandbox.pull: the sandbox container's image cannot be pulled") {
		t.Errorf("a sandbox rule with pull: %v", err)
	}
	if !rule(ok, "", false).BindsImage() || rule("", "", false).BindsImage() {
		t.Error("BindsImage: a pull reference binds the image, nothing does not")
	}
}

// pull_ca must be PEM certificates only, set with pull, over HTTPS.
func TestValidatePullCA(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "registry CA"}, NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	keyDER, _ := x509.MarshalECPrivateKey(key)
	privPEM := string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	ok := "registry:5000/app@" + testDigest
	rule := func(pull, ca string, plain bool) *Container {
		wd := Pattern("/")
		var id uint32
		return &Container{Image: "x", Args: []Pattern{"/app"}, WorkingDir: &wd, UID: &id, GID: &id, Pull: pull, PullCA: ca, PullPlainHTTP: plain}
	}
	for name, c := range map[string]struct {
		rule *Container
		err  string
	}{
		"CA":              {rule(ok, ca, false), ""},
		"two CAs":         {rule(ok, ca+ca, false), ""},
		"not PEM":         {rule(ok, "registry CA", false), "policy.containers.app.pull_ca: no PEM CERTIFICATE"},
		"a private key":   {rule(ok, ca+privPEM, false), "policy.containers.app.pull_ca: a PEM \"EC PRIVATE KEY\" block"},
		"trailing text":   {rule(ok, ca+"junk", false), "policy.containers.app.pull_ca: text after the last PEM certificate"},
		"bad DER":         {rule(ok, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2}})), false), "policy.containers.app.pull_ca: certificate 1:"},
		"with plain HTTP": {rule(ok, ca, true), "policy.containers.app.pull_ca: set with pull_plain_http"},
		"CA without pull": {rule("", ca, false), "policy.containers.app.pull_ca: set without pull"},
	} {
		err := (&Policy{Containers: map[string]*Container{"app": c.rule}}).Validate(nil)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: err = %v, want %q", name, err, c.err)
		}
	}
}
