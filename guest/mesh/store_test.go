package mesh

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
)

func TestStoreReplacesAtomically(t *testing.T) {
	ca := newTestCA(t)
	s := &Store{Dir: filepath.Join(t.TempDir(), "mesh")}
	read := func(f string) string {
		b, err := os.ReadFile(filepath.Join(s.Dir, f))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	a, b := ca.issue(t, idServer, time.Hour), ca.issue(t, idServer, time.Hour)
	if err := s.Write(a); err != nil {
		t.Fatal(err)
	}
	if read(meshapi.CertFile) != string(a.CertPEM) || read(meshapi.KeyFile) != string(a.KeyPEM) || read(meshapi.CAFile) != string(ca.pem) {
		t.Fatal("the files are not the certificate's")
	}
	// A reader holding the directory open (a bind mount) sees the new
	// files through the same names.
	if err := s.Write(b); err != nil {
		t.Fatal(err)
	}
	if read(meshapi.CertFile) != string(b.CertPEM) || read(meshapi.KeyFile) != string(b.KeyPEM) {
		t.Fatal("the renewal is not what the files show")
	}
	ents, _ := os.ReadDir(s.Dir)
	var versions int
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".v") {
			versions++
		}
	}
	if versions != 1 {
		t.Fatalf("%d version directories left, want the current one", versions)
	}
	if fi, err := os.Stat(filepath.Join(s.Dir, meshapi.KeyFile)); err != nil || fi.Mode().Perm() != 0o444 {
		t.Fatalf("key mode: %v %v", fi, err)
	}
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}
	ents, _ = os.ReadDir(s.Dir)
	if len(ents) != 0 {
		t.Fatalf("left after Remove: %v", ents)
	}
}
