package migrate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// A failed migration's handoff file goes once its destination VM is gone
// (destroyed now, or already by the rollback), and stays while that VM
// could not be destroyed: a `shim delete` after the shim dies then stops
// it.
func TestClearHandoff(t *testing.T) {
	for _, tc := range []struct {
		name     string
		del      error
		keepFile bool
	}{
		{"destroyed", nil, false},
		{"already gone", fmt.Errorf("DELETE: 404 (%w)", ErrNotFound), false},
		{"unreachable", errors.New("dial node-b: connection refused"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := WriteHandoff(dir, NewClient("/run/b.sock"), "pod1", ""); err != nil {
				t.Fatal(err)
			}
			err := ClearHandoff(context.Background(), dir, fakeDeleter{tc.del}, "pod1")
			_, serr := os.Stat(filepath.Join(dir, HandoffFile))
			if kept := serr == nil; kept != tc.keepFile || (err != nil) != tc.keepFile {
				t.Fatalf("ClearHandoff = %v; handoff file kept %v, want %v", err, kept, tc.keepFile)
			}
		})
	}
}

// The handoff file is written when the destination starts the VM, so a
// dead shim's cleanup may find one whose VM a rollback destroyed: that VM
// is gone, which is what was asked, and the file goes.
func TestStopHandedOffVMAlreadyGone(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "b.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var deletes atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
		}
		http.Error(w, `{"error":"no VM \"pod1\" on this node"}`, http.StatusNotFound)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	dir := t.TempDir()
	if err := WriteHandoff(dir, NewClient(sock), "pod1", ""); err != nil {
		t.Fatal(err)
	}
	if found, err := StopHandedOff(context.Background(), dir); !found || err != nil || deletes.Load() != 1 {
		t.Fatalf("StopHandedOff = %v, %v after %d DELETEs; want true, nil after 1", found, err, deletes.Load())
	}
	if _, err := os.Stat(filepath.Join(dir, HandoffFile)); !os.IsNotExist(err) {
		t.Fatalf("handoff file left: %v", err)
	}
}
