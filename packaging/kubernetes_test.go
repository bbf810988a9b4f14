package packaging

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"gopkg.in/yaml.v3"
)

// TestKubernetesManifest checks the node-installer DaemonSet and the
// RuntimeClass: golden, valid YAML, the fields Kubernetes requires, and
// that they agree with the rest of the packaging (the RuntimeClass handler
// is a handler the containerd drop-in registers).
func TestKubernetesManifest(t *testing.T) {
	out, err := Render("kubernetes/c8s.yaml", paths)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "kubernetes/c8s.yaml", out)

	docs := map[string]map[string]any{}
	dec := yaml.NewDecoder(strings.NewReader(out))
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not valid YAML: %v", err)
		}
		kind, _ := doc["kind"].(string)
		if _, dup := docs[kind]; dup {
			t.Fatalf("two %s documents", kind)
		}
		docs[kind] = doc
	}
	if len(docs) != 2 {
		t.Fatalf("want a DaemonSet and a RuntimeClass, got %d documents", len(docs))
	}

	ds := docs["DaemonSet"]
	if ds["apiVersion"] != "apps/v1" || get(t, ds, "metadata", "name") != "c8s-node-installer" {
		t.Fatalf("DaemonSet header: %v %v", ds["apiVersion"], ds["metadata"])
	}
	selector := get(t, ds, "spec", "selector", "matchLabels").(map[string]any)
	labels := get(t, ds, "spec", "template", "metadata", "labels").(map[string]any)
	for k, v := range selector {
		if labels[k] != v {
			t.Errorf("selector %s=%v does not match the pod template labels %v", k, v, labels)
		}
	}
	podSpec := get(t, ds, "spec", "template", "spec").(map[string]any)
	containers := podSpec["containers"].([]any)
	if len(containers) != 1 {
		t.Fatalf("%d containers", len(containers))
	}
	c := containers[0].(map[string]any)
	if c["image"] == "" || get(t, c, "securityContext", "privileged") != true {
		t.Errorf("installer container: image %v, privileged %v", c["image"], get(t, c, "securityContext", "privileged"))
	}
	script := strings.Join(anyStrings(c["command"]), " ")
	for _, want := range []string{"c8s-launcher install --root /host", "--restart", "--image-dir /opt/c8s/image"} {
		if !strings.Contains(script, want) {
			t.Errorf("installer command lacks %q: %s", want, script)
		}
	}
	mount := c["volumeMounts"].([]any)[0].(map[string]any)
	vol := podSpec["volumes"].([]any)[0].(map[string]any)
	if mount["mountPath"] != "/host" || mount["name"] != vol["name"] || get(t, vol, "hostPath", "path") != "/" {
		t.Errorf("the node's root is not mounted at /host: %v %v", mount, vol)
	}

	rc := docs["RuntimeClass"]
	if rc["apiVersion"] != "node.k8s.io/v1" {
		t.Fatalf("RuntimeClass apiVersion %v", rc["apiVersion"])
	}
	dropIn, err := Render("containerd/c8s.toml", paths)
	if err != nil {
		t.Fatal(err)
	}
	var ctrd struct {
		Plugins map[string]struct {
			Containerd struct {
				Runtimes map[string]any `toml:"runtimes"`
			} `toml:"containerd"`
		} `toml:"plugins"`
	}
	if err := toml.NewDecoder(bytes.NewReader([]byte(dropIn))).Decode(&ctrd); err != nil {
		t.Fatal(err)
	}
	handler, _ := rc["handler"].(string)
	if _, ok := ctrd.Plugins["io.containerd.cri.v1.runtime"].Containerd.Runtimes[handler]; !ok {
		t.Errorf("RuntimeClass handler %q is not registered by the containerd drop-in", handler)
	}
	nodeSel := get(t, rc, "scheduling", "nodeSelector").(map[string]any)
	dsSel := podSpec["nodeSelector"].(map[string]any)
	for k, v := range nodeSel {
		if dsSel[k] != v {
			t.Errorf("RuntimeClass schedules onto %s=%v but the installer runs on %v", k, v, dsSel)
		}
	}
}

func get(t *testing.T, m map[string]any, keys ...string) any {
	t.Helper()
	var v any = m
	for i, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s is not a mapping", strings.Join(keys[:i], "."))
		}
		v = mm[k]
	}
	return v
}

func anyStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
