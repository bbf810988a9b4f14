package policygen

import (
	"bytes"
	"encoding/base64"
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/c8s-dev/c8s/guest/api/initdata"
)

// Patch annotates each workload's pod with its init data, keeps the other
// documents and the comments, and the patched YAML generates the same
// init data (the annotation is not part of the policy).
func TestPatch(t *testing.T) {
	pod, _ := os.ReadFile("testdata/pod.yaml")
	dep, _ := os.ReadFile("testdata/deployment.yaml")
	in := append(append(append([]byte{}, dep...), "---\n"...), pod...)
	o := deploymentOptions(t)
	o.Secrets = nil
	o.KBS = initdata.KBS{}
	rs, err := Generate(in, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Kind != "Deployment" || rs[1].Kind != "Pod" {
		t.Fatalf("results %+v", rs)
	}
	out, err := Patch(in, rs)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte("# A Deployment whose image config")) || !bytes.Contains(out, []byte("kind: ConfigMap")) || !bytes.Contains(out, []byte("kind: Service")) {
		t.Errorf("the patched YAML lost a comment or a document:\n%s", out)
	}
	docs := strings.Split(string(out), "\n---\n")
	if len(docs) != 4 {
		t.Fatalf("%d documents, want 4:\n%s", len(docs), out)
	}
	for i, c := range []struct {
		doc  string
		path []string
		r    Result
	}{
		{docs[0], []string{"spec", "template", "metadata", "annotations"}, rs[0]},
		{docs[1], []string{"metadata", "annotations"}, rs[1]},
	} {
		var v map[string]any
		if err := yaml.Unmarshal([]byte(c.doc), &v); err != nil {
			t.Fatal(err)
		}
		var got any = v
		for _, k := range c.path {
			got = got.(map[string]any)[k]
		}
		ann := got.(map[string]any)[initdata.Annotation].(string)
		if dec, _ := base64.StdEncoding.DecodeString(ann); !bytes.Equal(dec, c.r.InitData) {
			t.Errorf("document %d: the annotation is not the init data", i)
		}
	}
	again, err := Generate(out, o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range rs {
		if !bytes.Equal(again[i].InitData, rs[i].InitData) {
			t.Errorf("%s: the patched YAML generates another document", rs[i].Kind)
		}
	}
	// Patching twice replaces the annotation.
	twice, err := Patch(out, again)
	if err != nil || strings.Count(string(twice), initdata.Annotation) != 2 {
		t.Errorf("patching twice: %v\n%s", err, twice)
	}
}
