package initdata

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	d, err := Parse(nil)
	if err != nil || !d.Agent.ExecAllowed() {
		t.Fatalf("empty init data: %+v, %v; want the default policy", d, err)
	}
	d, err = Parse([]byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n"))
	if err != nil || d.Agent.ExecAllowed() {
		t.Fatalf("allow_exec = false: %+v, %v", d, err)
	}
	for doc, want := range map[string]string{
		"version = \"0.1\"\n[agent_policy]\nallow_exek = false\n": "allow_exek",
		"version = \"9\"\n":                 "version \"9\"",
		"[agent_policy\n":                   "init data",
		"version = \"0.1\"\nallow_exec = 1": "allow_exec",
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error mentioning %q", doc, err, want)
		}
	}
}

func TestDigest(t *testing.T) {
	if Digest(nil) != [32]byte{} {
		t.Fatal("empty init data must give an all-zero HOST_DATA")
	}
	a, b := Digest([]byte("version = \"0.1\"\n")), Digest([]byte("version = \"0.1\"\n\n"))
	if a == b || a == [32]byte{} {
		t.Fatal("the digest must cover every byte of the document")
	}
}
