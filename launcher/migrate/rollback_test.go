package migrate

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/vm"
)

// fakeSource is the source's QEMU as a rollback sees it.
type fakeSource struct {
	state  string
	status string   // query-migrate's; completed when empty
	seq    []string // query-migrate's first answers, before status
	calls  []string
}

func (f *fakeSource) Execute(_ context.Context, command string, _, _ any) error {
	f.calls = append(f.calls, command)
	return nil
}
func (f *fakeSource) QueryMigrate(context.Context) (vm.MigrationInfo, error) {
	f.calls = append(f.calls, "query-migrate")
	if len(f.seq) > 0 {
		st := f.seq[0]
		f.seq = f.seq[1:]
		return vm.MigrationInfo{Status: st}, nil
	}
	if f.status == "" {
		return vm.MigrationInfo{Status: vm.MigrationCompleted}, nil
	}
	return vm.MigrationInfo{Status: f.status}, nil
}
func (f *fakeSource) MigrateCancel(context.Context) error {
	f.calls = append(f.calls, "migrate_cancel")
	return nil
}
func (f *fakeSource) RunState(context.Context) (string, error) { return f.state, nil }
func (f *fakeSource) Cont(context.Context) error {
	f.calls = append(f.calls, "cont")
	f.state = "running"
	return nil
}

type fakeDeleter struct{ err error }

func (f fakeDeleter) Delete(context.Context, string) error { return f.err }

// A migration that completed (the source in postmigrate), then failed (its
// re-attestation, say), while the destination cannot be reached to destroy
// its VM: the destination holds the whole guest and may run it, so the
// source is not resumed, and the error says what to do. Two running
// copies would both hold the pod's released secrets and mesh identity.
func TestMaliciousHostRollbackNeverRunsTwoCopies(t *testing.T) {
	cause := errors.New("re-attestation on node node-b failed: connection reset")
	unreachable := fakeDeleter{errors.New("dial node-b: connection refused")}
	// The transfer completed (postmigrate), or may complete (QEMU sending
	// the last pages, or query-migrate says completed whatever the state).
	for _, src := range []*fakeSource{
		{state: vm.RunStatePostmigrate},
		{state: runStateFinishMigrate, status: "failed"},
		{state: "paused", status: vm.MigrationCompleted},
	} {
		err := (&rollback{src: src, dst: unreachable, id: "vm1", node: "node-b"}).do(context.Background(), cause)
		if err == nil || !strings.Contains(err.Error(), "ROLLBACK INCOMPLETE") || !strings.Contains(err.Error(), "the source stays paused") || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("source %s, migration %s: rollback = %v", src.state, src.status, err)
		}
		for _, c := range src.calls {
			if c == "cont" {
				t.Fatalf("source %s, migration %s: resumed while the destination VM may run: %v", src.state, src.status, src.calls)
			}
		}
	}
	var src *fakeSource
	var err error

	// The destination VM destroyed (or unknown there): the source resumes.
	for _, derr := range []error{nil, ErrNotFound} {
		src = &fakeSource{state: vm.RunStatePostmigrate}
		err = (&rollback{src: src, dst: fakeDeleter{derr}, id: "vm1", node: "node-b"}).do(context.Background(), cause)
		if err == nil || !strings.Contains(err.Error(), "rolled back") || src.state != "running" {
			t.Errorf("destination delete %v: rollback = %v, source %s", derr, err, src.state)
		}
	}
	// A migration that never completed left the destination no guest to
	// run: the source resumes even if its VM could not be destroyed.
	src = &fakeSource{state: "paused", status: vm.MigrationCancelled}
	err = (&rollback{src: src, dst: fakeDeleter{errors.New("unreachable")}, id: "vm1", node: "node-b"}).do(context.Background(), cause)
	if err == nil || !strings.Contains(err.Error(), "ROLLBACK INCOMPLETE") || src.state != "running" {
		t.Errorf("an incomplete migration: rollback = %v, source %s", err, src.state)
	}
}

// A rollback that finds QEMU sending the last pages and device state
// (status device) lets it finish rather than cancel it: the destination
// may have the whole guest, and QEMU resumes a source whose migration was
// cancelled by itself. Completed, with the destination unreachable, the
// source stays paused.
func TestRollbackLetsTheLastPagesFinish(t *testing.T) {
	src := &fakeSource{state: vm.RunStatePostmigrate, seq: []string{migrationStatusDevice, migrationStatusDevice}}
	err := (&rollback{src: src, dst: fakeDeleter{errors.New("unreachable")}, id: "vm1", node: "node-b"}).do(context.Background(), errors.New("timed out"))
	if err == nil || !strings.Contains(err.Error(), "the source stays paused") {
		t.Fatalf("rollback = %v", err)
	}
	for _, c := range src.calls {
		if c == "migrate_cancel" || c == "cont" {
			t.Fatalf("%s during the device phase: %v", c, src.calls)
		}
	}
	// In the active phase a migration is cancelled.
	src = &fakeSource{state: "running", seq: []string{"active"}, status: vm.MigrationCancelled}
	if err := (&rollback{src: src, dst: fakeDeleter{}, id: "vm1", node: "node-b"}).do(context.Background(), errors.New("timed out")); err == nil {
		t.Fatal("a rollback returned no error")
	}
	if !strings.Contains(strings.Join(src.calls, " "), "migrate_cancel") {
		t.Fatalf("an active migration was not cancelled: %v", src.calls)
	}
}

// A VM an earlier migration left behind (its destination not destroyed)
// is not migrated again: that migration's rollback would resume it beside
// the first destination's copy.
func TestMaliciousHostMigratesALeftBehindSource(t *testing.T) {
	for state, ok := range map[string]bool{"running": true, "paused": true, vm.RunStatePostmigrate: false, runStateFinishMigrate: false, "inmigrate": false} {
		err := checkSourceState(context.Background(), &fakeSource{state: state})
		if ok != (err == nil) || !ok && !strings.Contains(err.Error(), "earlier migration") {
			t.Errorf("state %s: %v", state, err)
		}
	}
}
