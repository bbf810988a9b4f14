package packaging

import (
	"errors"
	"io"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestKubernetesManifest checks the node-installer DaemonSet: golden, valid
// YAML, the fields Kubernetes requires, and that its pod runs
// c8s-launcher install against the node's root.
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
	if len(docs) != 1 || docs["DaemonSet"] == nil {
		t.Fatalf("want one DaemonSet, got %d documents", len(docs))
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
