package statedir

import (
	"path/filepath"
	"strings"
	"testing"
)

// Containerd's longest namespace and a CRI sandbox ID.
var (
	longNS = strings.Repeat("n", 76)
	criID  = strings.Repeat("0123456789abcdef", 4)
)

func TestShortNamesAreKept(t *testing.T) {
	got := ForPod("/run/c8s", "default", "pod1")
	want := Pod{VM: "/run/c8s/default/pod1", Disks: "/run/c8s/default/disks/pod1", FS: "/run/c8s/default/fs/pod1"}
	if got != want {
		t.Fatalf("ForPod = %+v, want %+v", got, want)
	}
	for _, ns := range []string{"k8s.io", "moby", "c8s-test-1234567"} {
		if NamespaceName(ns) != ns {
			t.Errorf("NamespaceName(%q) = %q", ns, NamespaceName(ns))
		}
	}
	if id := strings.Repeat("a", podKeep); PodName(id) != id {
		t.Errorf("PodName(%q) = %q", id, PodName(id))
	}
	if FSDir(got.VM) != got.FS {
		t.Errorf("FSDir(%s) = %s, want %s", got.VM, FSDir(got.VM), got.FS)
	}
	if Incoming("/run/c8s", "pod1") != "/run/c8s/migrate/pod1" || Standalone("/run/c8s", "x") != "/run/c8s/x" {
		t.Errorf("Incoming, Standalone: %s, %s", Incoming("/run/c8s", "pod1"), Standalone("/run/c8s", "x"))
	}
}

func TestLongNamesAreBoundedAndDistinct(t *testing.T) {
	// Two long namespaces that share a long prefix, and two IDs alike.
	a, b := longNS, strings.Repeat("n", 75)+"m"
	if NamespaceName(a) == NamespaceName(b) {
		t.Fatalf("namespaces %q and %q share dir %q", a, b, NamespaceName(a))
	}
	id2 := criID[:63] + "0"
	if PodName(criID) == PodName(id2) {
		t.Fatalf("IDs %q and %q share dir %q", criID, id2, PodName(criID))
	}
	if ForPod("/run/c8s", a, criID) == ForPod("/run/c8s", b, criID) {
		t.Fatal("pods of different namespaces share dirs")
	}
	for _, ns := range []string{a, "c8s-test-1234567890", "a/b", "..", "", "node", "migrate", "cache", "ns,with,commas", "名前空間"} {
		n := NamespaceName(ns)
		if len(n) != nsKeep+1 || !plainName(n) {
			t.Errorf("NamespaceName(%q) = %q: want a plain name of %d bytes", ns, n, nsKeep+1)
		}
	}
	for _, id := range []string{criID, strings.Repeat("x", 76), "../../etc", ".", "fs", "disks", "a b"} {
		n := PodName(id)
		if len(n) != podKeep+1 || !plainName(n) {
			t.Errorf("PodName(%q) = %q: want a plain name of %d bytes", id, n, podKeep+1)
		}
	}
	// A shortened name keeps a prefix an admin can match.
	if n := PodName(criID); !strings.HasPrefix(n, criID[:podPrefix]+"-") {
		t.Errorf("PodName(%q) = %q", criID, n)
	}
	// No kept name looks like a shortened one.
	if short := PodName(criID); PodName(short) == short {
		t.Errorf("the shortened name %q is also kept", short)
	}
}

// plainName: letters, digits, '.', '_', '-', not starting with '.' or '-'
// (no commas for QEMU's options, no hidden files, nothing like a flag).
func plainName(n string) bool {
	for i := 0; i < len(n); i++ {
		if !nameByte(n[i]) {
			return false
		}
	}
	return n != "" && n[0] != '.' && n[0] != '-'
}

func TestEverySocketFits(t *testing.T) {
	root := "/" + strings.Repeat("r", MaxRoot-1)
	sock := strings.Repeat("s", MaxSocketName)
	d := ForPod(root, longNS, criID)
	for _, dir := range []string{d.VM, d.FS, Incoming(root, criID), Standalone(root, criID)} {
		if p := filepath.Join(dir, sock); len(p) > UnixPathMax {
			t.Errorf("%s: %d > %d bytes", p, len(p), UnixPathMax)
		}
	}
	if p := filepath.Join(d.FS, sock); len(p) != UnixPathMax {
		t.Errorf("the deepest socket %s has %d bytes: MaxSocketName does not use the room there is", p, len(p))
	}
	if MaxSocketName < len("c8s.attest.sock") {
		t.Errorf("MaxSocketName %d is too small for the sockets c8s makes", MaxSocketName)
	}
}

func TestIndex(t *testing.T) {
	dir := t.TempDir()
	want := Index{Namespace: longNS, ID: criID}
	if err := WriteIndex(dir, want); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadIndex(dir); err != nil || got != want {
		t.Fatalf("ReadIndex = %+v, %v; want %+v", got, err, want)
	}
}
