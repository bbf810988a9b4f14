package layercache

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
)

// A node that is both ends of a migration (or receives a pod whose id a
// local pod also has) keeps the two references apart; Ref reads one back
// with the namespace the pod recorded.
func TestIncomingRefAndRef(t *testing.T) {
	c, err := Open(filepath.Join(t.TempDir(), "layers"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pod, err := PodRef("k8s.io", "pod1", "/run/c8s/pod1")
	if err != nil {
		t.Fatal(err)
	}
	in, err := IncomingRef("pod1", "/run/c8s/migrate/pod1")
	if err != nil {
		t.Fatal(err)
	}
	if in.Name == pod.Name || in.check() != nil || in.PID != os.Getpid() || !c.alive(in) {
		t.Fatalf("incoming ref %+v next to pod ref %+v", in, pod)
	}
	d := digest.FromString("layer")
	build := func(_ context.Context, out *os.File) (Meta, error) {
		out.Write([]byte("disk"))
		return Meta{DiffID: d, RootHash: d.Encoded(), DataBlocks: 1}, nil
	}
	for _, r := range []Ref{pod, in} {
		if _, _, err := c.Acquire(ctx, d, r, build); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.Ref(d, pod.Name)
	if err != nil || got.Namespace != "k8s.io" || got.Pod != "pod1" || got.Name != pod.Name {
		t.Fatalf("Ref(pod) = %+v, %v", got, err)
	}
	if err := c.Release(ctx, d, pod.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ref(d, pod.Name); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Ref of a released reference = %v, want fs.ErrNotExist", err)
	}
	if got, err := c.Ref(d, in.Name); err != nil || got.Pod != "pod1" || got.StateDir != "/run/c8s/migrate/pod1" {
		t.Fatalf("Ref(incoming) after the pod's release = %+v, %v", got, err)
	}
	if _, err := c.Ref(d, "../x"); err == nil {
		t.Fatal("Ref accepted a name that is not a file name")
	}
}
