package policygen

import (
	"bytes"
	"encoding/base64"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// appImage is the config of ghcr.io/example/app, as --image would read it
// from its layout.
func appImage() *Image {
	return &Image{
		Source:  "test",
		Digests: []digest.Digest{"sha256:9d4e4bb5b1f3b8c14b3e0a7f6e6c2a1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b"},
		Config: ocispec.ImageConfig{
			Entrypoint: []string{"/usr/bin/app"},
			Cmd:        []string{"serve"},
			Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/app", "APP_PORT=8080"},
			WorkingDir: "/srv/app",
			User:       "app",
		},
		UserDB: func() ([]byte, []byte, error) {
			return []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002::/home/app:/sbin/nologin\n"), []byte("root:x:0:\napp:x:1002:\n"), nil
		},
		// As `c8s-measure image` reads them from the layout.
		Layers: []policyapi.Layer{
			{Digest: "sha256:" + strings.Repeat("1a", 32), Verity: strings.Repeat("2b", 32), Blocks: 1187},
			{Digest: "sha256:" + strings.Repeat("3c", 32), Verity: strings.Repeat("4d", 32), Blocks: 35},
		},
		LayerBlobs: []ocispec.Descriptor{
			{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.Digest("sha256:" + strings.Repeat("5e", 32)), Size: 2621440},
			{MediaType: ocispec.MediaTypeImageLayerZstd, Digest: digest.Digest("sha256:" + strings.Repeat("6f", 32)), Size: 1234},
		},
	}
}

// deploymentOptions are the options of the deployment goldens: a
// broker and a secret, an exec for debugging, a port-forward.
func deploymentOptions(t *testing.T) Options {
	cert, err := os.ReadFile("testdata/kbs.pem")
	if err != nil {
		t.Fatal(err)
	}
	return Options{
		Images:      map[string]*Image{"ghcr.io/example/app@sha256:9d4e4bb5b1f3b8c14b3e0a7f6e6c2a1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b": appImage()},
		KBS:         initdata.KBS{URL: "https://kbs.example:8080", Cert: string(cert)},
		Secrets:     []Secret{{Container: "app", Resource: "kbs:///default/key/db-password", Path: "/run/secrets/db-password"}},
		Exec:        map[string][][]policyapi.Pattern{"app": {{"/usr/bin/app", "debug", "re:--level=[0-9]"}}},
		PortForward: []uint32{8080},
	}
}

// The init data of each testdata workload is its golden file, byte for
// byte (go test -update rewrites them), and reads back as it was meant.
func TestGolden(t *testing.T) {
	coco := func(t *testing.T) Options { o := deploymentOptions(t); o.Format = initdata.FormatCoCo; return o }
	for _, c := range []struct {
		yaml, golden string
		opts         func(*testing.T) Options
	}{
		{"pod.yaml", "pod.golden.toml", func(*testing.T) Options { return Options{} }},
		{"deployment.yaml", "deployment.golden.toml", deploymentOptions},
		{"deployment.yaml", "deployment.coco.golden.toml", coco},
	} {
		t.Run(c.golden, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", c.yaml))
			if err != nil {
				t.Fatal(err)
			}
			rs, err := Generate(data, c.opts(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) != 1 {
				t.Fatalf("%d results, want 1", len(rs))
			}
			r := rs[0]
			golden := filepath.Join("testdata", c.golden)
			if *update {
				if err := os.WriteFile(golden, r.InitData, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -update writes it)", err)
			}
			if !bytes.Equal(r.InitData, want) {
				t.Errorf("init data differs from %s (go test -update rewrites it):\n%s", golden, r.InitData)
			}
			if _, err := initdata.Parse(r.InitData); err != nil {
				t.Fatal(err)
			}
			if dec, _ := base64.StdEncoding.DecodeString(r.Annotation); !bytes.Equal(dec, r.InitData) {
				t.Error("the annotation is not the base64 of the init data")
			}
			if r.HostData != initdata.Digest(r.InitData) || r.MRConfigID != initdata.DigestTDX(r.InitData) {
				t.Error("digests differ from initdata.Digest and DigestTDX")
			}
			// Deterministic: the same input gives the same bytes.
			again, err := Generate(data, c.opts(t))
			if err != nil || !bytes.Equal(again[0].InitData, r.InitData) {
				t.Error("a second run wrote another document")
			}
		})
	}
}

// The CoCo document digests as its algorithm says and carries the c8s
// document in its c8s.toml entry.
func TestCoCoFormat(t *testing.T) {
	data, _ := os.ReadFile("testdata/deployment.yaml")
	plain, err := Generate(data, deploymentOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range initdata.CoCoAlgorithms {
		o := deploymentOptions(t)
		o.Format, o.Algorithm = initdata.FormatCoCo, alg
		rs, err := Generate(data, o)
		if err != nil {
			t.Fatal(err)
		}
		c, err := initdata.ParseCoCo(rs[0].InitData)
		if err != nil || c.Algorithm != alg {
			t.Fatalf("ParseCoCo = %+v, %v", c, err)
		}
		entry, err := initdata.Parse([]byte(c.Data[initdata.CoCoC8sKey]))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := initdata.Parse(plain[0].InitData)
		if !reflect.DeepEqual(entry.Policy, want.Policy) || !reflect.DeepEqual(entry.KBS, want.KBS) {
			t.Errorf("%s: the c8s.toml entry is not the c8s document's policy", alg)
		}
		if !strings.Contains(c.Data[initdata.CoCoC8sKey], "The CoCo document holding it is digested") {
			t.Errorf("%s: the c8s.toml entry's header should say the CoCo document is digested", alg)
		}
		d, err := initdata.Parse(rs[0].InitData)
		if err != nil || d.Format != initdata.FormatCoCo || d.Policy == nil || d.KBS.URL == "" {
			t.Fatalf("Parse = %+v, %v", d, err)
		}
	}
	o := deploymentOptions(t)
	o.Format, o.Algorithm = initdata.FormatCoCo, "md5"
	if _, err := Generate(data, o); err == nil || !strings.Contains(err.Error(), "md5") {
		t.Errorf("algorithm md5: %v", err)
	}
}
