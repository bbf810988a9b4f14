package task

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/launcher/vm"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
	"github.com/c8s-dev/c8s/shim/layers"
	"github.com/c8s-dev/c8s/shim/sandbox"
)

// A layer-mode pod migrates with its layers described for the
// destination (diff ID, the cached disk's dm-verity root and size, the
// blob to convert, the namespace), and the source drops the pod's
// references on them only once the VM runs there: a failed migration
// keeps them; after the hand-off the cache can prune them, and the pod's
// later teardown finds nothing left to release.
func TestMigrateHandsLayersOff(t *testing.T) {
	h := newHarness(t, setup{})
	a := admin{h.s}
	ctrd := h.host.Containerd()
	app := ctrd.Image("app", "base", "app")
	ctrd.Run("pod1", app)
	h.create("pod1", "pod1")
	sb := h.vm()
	if r := h.refs(); len(r) != 2 {
		t.Fatalf("references before the move: %v, want the pod on app's 2 layers", r)
	}

	// A failed migration keeps the references: the VM still runs here.
	sb.Fail("Migrate", errors.New("destination refused"))
	if _, err := a.Migrate(h.ctx, &adminapi.MigrateRequest{Destination: "/run/x.sock"}); err == nil {
		t.Fatal("Migrate succeeded with a failing VM")
	}
	if r := h.refs(); len(r) != 2 {
		t.Fatalf("references after a failed migration: %v, want both kept", r)
	}
	sb.Fail("Migrate", nil)

	sb.SetMigration(&sandbox.Migrated{
		Node: "node2", Verified: &sandbox.Verified{Provider: "sim", SNP: &attest.SNPClaims{VCPUs: 1}},
		Result: &migrate.Result{Info: vm.MigrationInfo{TotalTime: 100}, Total: time.Second},
	}, vm.MigrationInfo{}, false)
	if _, err := a.Migrate(h.ctx, &adminapi.MigrateRequest{Destination: "/run/x.sock"}); err != nil {
		t.Fatal(err)
	}
	calls := sb.Calls("Migrate")
	got := calls[len(calls)-1].Req.(sandbox.MigrateOptions)
	if got.Namespace != "test" {
		t.Errorf("namespace sent %q, want the pod's (test)", got.Namespace)
	}
	var want []migrate.Layer
	for _, l := range app.Layers {
		e, err := h.cache().Lookup(l.DiffID)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, migrate.Layer{Disk: layers.DiskID(l.DiffID), DiffID: l.DiffID, RootHash: e.RootHash, DataBlocks: e.DataBlocks,
			Blob: l.Blob.Digest, MediaType: l.Blob.MediaType})
	}
	slices.SortFunc(want, func(x, y migrate.Layer) int { return compareDigest(x.DiffID, y.DiffID) })
	if !slices.Equal(got.Layers, want) {
		t.Fatalf("layers sent to the destination:\n%+v\nwant\n%+v", got.Layers, want)
	}
	if r := h.refs(); len(r) != 0 {
		t.Fatalf("references after the hand-off: %v, want none on the source", r)
	}
	h.delete("pod1")
	if r := h.refs(); len(r) != 0 || !sb.Stopped() {
		t.Fatalf("after the moved pod's teardown: references %v, VM stopped %v", r, sb.Stopped())
	}
}

func compareDigest(a, b digest.Digest) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
