package task

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/shim/sharedfs"
)

func TestShareMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for bind mounts")
	}
	dir := filepath.Join(t.TempDir(), "fs")
	sh, err := sharedfs.Start(context.Background(), "/usr/lib/qemu/virtiofsd", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	host := t.TempDir()
	small := filepath.Join(host, "hosts")
	if err := os.WriteFile(small, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(host, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/etc/hosts", Type: "bind", Source: small, Options: []string{"rbind", "ro"}},
		{Destination: "/data", Type: "bind", Source: vol, Options: []string{"rbind", "ro"}},
		{Destination: "/again", Source: vol, Options: []string{"bind"}},
		{Destination: "/gone", Type: "bind", Source: filepath.Join(host, "missing")},
	}}
	s := &service{}
	pod := &podState{share: sh, shared: map[string][]string{}}
	got, err := s.shareMounts(context.Background(), pod, "c1", spec, []*agent.File{{Source: small}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Source != vol || got[0].Name != "c1-2" {
		t.Fatalf("shared %v, want only the directory, once, as c1-2", got)
	}
	shared := filepath.Join(dir, "shared", "c1-2")
	if err := os.WriteFile(filepath.Join(shared, "x"), nil, 0o644); err == nil {
		t.Error("the ro bind mount was shared writable")
	}
	s.unshare(context.Background(), pod, "c1")
	if _, err := os.Stat(shared); !os.IsNotExist(err) {
		t.Fatalf("share after unshare: %v", err)
	}
	if got, err := s.shareMounts(context.Background(), &podState{}, "c2", spec, nil); err != nil || got != nil {
		t.Fatalf("pod without a share: %v %v", got, err)
	}
}
