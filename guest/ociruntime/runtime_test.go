package ociruntime

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestLogTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.json")
	log := `{"level":"info","msg":"starting","time":"t"}
{"level":"warning","msg":"w1","time":"t"}
not json at all
{"level":"error","msg":"runc create failed: unable to start container process: exec: \"/x\": no such file","time":"t"}
{"level":"debug","msg":"noise","time":"t"}
`
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got := LogTail(path, 2)
	want := `not json at all; runc create failed: unable to start container process: exec: "/x": no such file`
	if got != want {
		t.Errorf("LogTail = %q, want %q", got, want)
	}
	if got := LogTail(filepath.Join(t.TempDir(), "missing"), 3); got != "" {
		t.Errorf("missing log: %q", got)
	}
}

// Exists knows a container by either runtime's state file: runc writes
// state.json, crun (the guest's) status. Missing crun's made the agent
// skip `crun delete` on RemoveContainer: a running container's processes
// outlived it, holding its root.
func TestExists(t *testing.T) {
	rt := &Runtime{Root: t.TempDir()}
	for id, file := range map[string]string{"runc-c": "state.json", "crun-c": "status"} {
		if rt.Exists(context.Background(), id) {
			t.Fatalf("%s exists before its state", id)
		}
		if err := os.MkdirAll(filepath.Join(rt.Root, id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rt.Root, id, file), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if !rt.Exists(context.Background(), id) {
			t.Errorf("%s (%s) not found", id, file)
		}
	}
}
