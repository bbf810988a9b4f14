package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/measurements/internal/ociimage"
	"github.com/c8s-dev/c8s/measurements/internal/ocilayout"
	"github.com/c8s-dev/c8s/measurements/policygen"
)

const policyTestdata = "../../policygen/testdata/"

// The summary names the annotation and both digests; -o writes the
// document they are digests of.
func TestPolicyCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "initdata.toml")
	stdout, stderr, err := measureWarn(runPolicy, policyTestdata+"pod.yaml", "-o", out)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := initdata.Parse(doc); err != nil {
		t.Fatal(err)
	}
	hd, mr := initdata.Digest(doc), initdata.DigestTDX(doc)
	for _, want := range []string{
		"Pod shop/web\n", "initdata    " + out + " (c8s format, ",
		"annotation  io.c8s.initdata: " + base64.StdEncoding.EncodeToString(doc) + "\n",
		"host_data   " + hex.EncodeToString(hd[:]) + "  (SNP HOST_DATA, sim: SHA-256 of the document)",
		"mrconfigid  " + hex.EncodeToString(mr[:]) + "  (TDX MRCONFIGID: SHA-384 of the document)",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout does not say %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, `warning: container sidecar: IMAGE "docker.io/library/busybox:1.36" IS NOT PINNED BY DIGEST`) {
		t.Errorf("no loud warning about the unpinned image:\n%s", stderr)
	}
	// --strict refuses it.
	if _, _, err := measureWarn(runPolicy, "--strict", policyTestdata+"pod.yaml"); err == nil || !strings.Contains(err.Error(), "not pinned by digest") {
		t.Errorf("--strict: %v", err)
	}
	// The document alone, and the annotation alone.
	raw, _, err := measureWarn(runPolicy, "--output-format", "initdata", policyTestdata+"pod.yaml")
	if err != nil || raw != string(doc) {
		t.Errorf("--output-format initdata: %v", err)
	}
	ann, _, err := measureWarn(runPolicy, policyTestdata+"pod.yaml", "--output-format", "annotation")
	if err != nil || ann != base64.StdEncoding.EncodeToString(doc)+"\n" {
		t.Errorf("--output-format annotation: %q, %v", ann, err)
	}
}

// --image reads a layout; --format coco, --kbs-*, --secret, --allow-exec,
// --no-logs and json output; --patch writes the annotated YAML.
func TestPolicyCommandImageAndJSON(t *testing.T) {
	dir := t.TempDir()
	ref := "ghcr.io/example/app@sha256:9d4e4bb5b1f3b8c14b3e0a7f6e6c2a1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b"
	digests, err := ocilayout.Write(dir, ocilayout.Image{Name: "ghcr.io/example/app:1", Config: ocispec.ImageConfig{
		Entrypoint: []string{"/usr/bin/app"}, Cmd: []string{"serve"}, WorkingDir: "/srv/app", User: "app",
		Env: []string{"PATH=/usr/bin:/bin"},
	}, Layers: []map[string]string{{"etc/passwd": "app:x:1001:1002::/:/bin/sh\n"}}})
	if err != nil {
		t.Fatal(err)
	}
	yaml, _ := os.ReadFile(policyTestdata + "deployment.yaml")
	// Pin the layout's image.
	yaml = bytes.ReplaceAll(yaml, []byte(ref), []byte("ghcr.io/example/app@"+digests[0].String()))
	in := filepath.Join(t.TempDir(), "deployment.yaml")
	if err := os.WriteFile(in, yaml, 0o644); err != nil {
		t.Fatal(err)
	}
	patched := filepath.Join(t.TempDir(), "patched.yaml")
	args := []string{in, "--image", "ghcr.io/example/app@" + digests[0].String() + "=" + dir, "--format", "coco",
		"--kbs-url", "https://kbs.example:8080", "--kbs-cert", policyTestdata + "kbs.pem",
		"--secret", "app:kbs:///default/key/db:/run/secrets/db", "--allow-exec", `app=["/usr/bin/app", "debug"]`,
		"--no-logs", "--output-format", "json", "--patch", patched}
	stdout, _, err := measureWarn(runPolicy, args...)
	if err != nil {
		t.Fatal(err)
	}
	var js []policyJSON
	if err := json.Unmarshal([]byte(stdout), &js); err != nil || len(js) != 1 {
		t.Fatalf("json: %v\n%s", err, stdout)
	}
	j := js[0]
	d, err := initdata.Parse([]byte(j.InitData))
	if err != nil {
		t.Fatal(err)
	}
	hd := initdata.Digest([]byte(j.InitData))
	app := d.Policy.Containers["app"]
	switch {
	case j.Kind != "Deployment" || j.Format != "coco" || d.Format != initdata.FormatCoCo:
		t.Errorf("json %+v", j)
	case j.HostData != hex.EncodeToString(hd[:]):
		t.Error("host_data is not the document's")
	case *app.UID != 1001 || *app.GID != 1002 || *app.WorkingDir != "/srv/app" || app.Logs:
		t.Errorf("app's rule %+v: want the layout's user and working dir, no logs", app)
	case len(app.Secrets) != 1 || d.KBS.URL != "https://kbs.example:8080" || len(app.Exec) != 2:
		t.Errorf("app's rule %+v, kbs %+v", app, d.KBS)
	}
	// The layout's layer is pinned, as `c8s-measure image` prints it.
	img, err := ociimage.OpenLayout(context.Background(), dir, "ghcr.io/example/app@"+digests[0].String())
	if err != nil {
		t.Fatal(err)
	}
	layers, err := ociimage.MeasureLayers(context.Background(), img, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := []policyapi.Layer{policygen.PolicyLayer(layers[0].Disk)}; !reflect.DeepEqual(app.Layers, want) || app.Layers[0].Digest != img.ConfigFile.RootFS.DiffIDs[0].String() {
		t.Errorf("app's layers %+v, want %+v", app.Layers, want)
	}
	p, err := os.ReadFile(patched)
	if err != nil || !bytes.Contains(p, []byte(initdata.Annotation+": "+j.Annotation[initdata.Annotation])) {
		t.Errorf("--patch: %v", err)
	}
}

func TestPolicyCommandRefuses(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "want one YAML file"},
		{[]string{policyTestdata + "pod.yaml", "--output-format", "xml"}, `--output-format "xml"`},
		{[]string{policyTestdata + "pod.yaml", "--secret", "app:x"}, "want CONTAINER:RESOURCE:PATH"},
		{[]string{policyTestdata + "pod.yaml", "--secret", "app:kbs:///a/b/c:/s"}, "--secret needs both"},
		{[]string{policyTestdata + "pod.yaml", "--allow-exec", "app"}, "want CONTAINER=ARGV"},
		{[]string{policyTestdata + "pod.yaml", "--allow-exec", "app=re:("}, "re:("},
		{[]string{policyTestdata + "pod.yaml", "--image", "x"}, "want REF=LAYOUT"},
		{[]string{policyTestdata + "pod.yaml", "--allow-port-forward", "70000"}, "want a TCP port"},
		{[]string{policyTestdata + "pod.yaml", "--patch", "-", "--output-format", "json"}, "--output-format does not apply"},
		{[]string{policyTestdata + "deployment.yaml"}, "cannot pin the args of container migrate"},
	} {
		if _, _, err := measureWarn(runPolicy, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}
