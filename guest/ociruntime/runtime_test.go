package ociruntime

import (
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
