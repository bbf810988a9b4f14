package manager

import (
	"os"
	"path/filepath"
	"testing"
)

func TestGroupOfUsesThePodAnnotation(t *testing.T) {
	dir := t.TempDir()
	write := func(json string) string {
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, []byte(json), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct{ spec, want string }{
		{`{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1"}}`, "pod1"},
		{`{"annotations":{"io.containerd.c8s.v2.group":"g","io.kubernetes.cri.sandbox-id":"pod1"}}`, "g"},
		{`{"annotations":{"other":"x"}}`, "c1"},
		{`{}`, "c1"},
	}
	for _, c := range cases {
		got, err := groupOf("c1", write(c.spec))
		if err != nil || got != c.want {
			t.Errorf("groupOf(%s) = %q, %v; want %q", c.spec, got, err, c.want)
		}
	}
	if _, err := groupOf("c1", write(`{not json`)); err == nil {
		t.Error("malformed spec accepted")
	}
}
