package task

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/launcher/vm"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
	"github.com/c8s-dev/c8s/shim/sandbox"
)

// The shim's Admin API: re-attestation and migration of the running pod.

func TestAdminAttest(t *testing.T) {
	h := newHarness(t, setup{})
	a := admin{h.s}
	if _, err := a.Attest(h.ctx, &adminapi.AttestRequest{}); !isClass(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Attest with no pod: %v, want FailedPrecondition", errClass(err))
	}
	h.create("pod1", "pod1")
	sb := h.vm()
	sb.SetVerified(&sandbox.Verified{Provider: "sim", SNP: &attest.SNPClaims{VCPUs: 1, Simulated: true}})
	resp, err := a.Attest(h.ctx, &adminapi.AttestRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var claims attest.SNPClaims
	if err := json.Unmarshal(resp.ClaimsJson, &claims); err != nil || resp.Sandbox != "pod1" || resp.Provider != "sim" || !claims.Simulated || claims.VCPUs != 1 {
		t.Errorf("Attest %+v (claims %+v, %v)", resp, claims, err)
	}
	sb.Fail("Attest", errors.New("measurement mismatch"))
	if _, err := a.Attest(h.ctx, &adminapi.AttestRequest{}); !isClass(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "measurement mismatch") {
		t.Errorf("failed re-attestation: %v, want FailedPrecondition with the reason", errClass(err))
	}
	sb.Die(errors.New("qemu: killed"))
	if _, err := a.Attest(h.ctx, &adminapi.AttestRequest{}); !isClass(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no running pod VM") {
		t.Errorf("Attest of a dead VM: %v, want FailedPrecondition", errClass(err))
	}
}

func TestAdminMigrate(t *testing.T) {
	h := newHarness(t, setup{})
	a := admin{h.s}
	if _, err := a.Migrate(h.ctx, &adminapi.MigrateRequest{}); !isClass(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Migrate with no destination: %v, want InvalidArgument", errClass(err))
	}
	if _, err := a.Migrate(h.ctx, &adminapi.MigrateRequest{Destination: "/run/x.sock"}); !isClass(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Migrate with no pod: %v, want FailedPrecondition", errClass(err))
	}
	if _, err := a.MigrationProgress(h.ctx, &adminapi.MigrationProgressRequest{}); !isClass(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("MigrationProgress with no pod: %v, want FailedPrecondition", errClass(err))
	}
	h.create("pod1", "pod1")
	sb := h.vm()
	if _, err := a.Migrate(h.ctx, &adminapi.MigrateRequest{Destination: "node2:1234"}); !isClass(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Migrate to a destination that is no socket: %v, want InvalidArgument", errClass(err))
	}
	sb.SetMigration(&sandbox.Migrated{
		Node:     "node2",
		Verified: &sandbox.Verified{Provider: "sim", SNP: &attest.SNPClaims{VCPUs: 2}},
		Result:   &migrate.Result{Info: vm.MigrationInfo{TotalTime: 900, Downtime: 40}, Total: 2 * time.Second, Reattest: 300 * time.Millisecond},
	}, vm.MigrationInfo{Status: "active", RAM: &vm.MigrationRAM{Transferred: 10, Remaining: 20, Total: 30, DirtyPagesRate: 4, Mbps: 1.5}}, true)
	resp, err := a.Migrate(h.ctx, &adminapi.MigrateRequest{Destination: "/run/x.sock", TimeoutSeconds: 60, MaxBandwidth: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Sandbox != "pod1" || resp.Node != "node2" || resp.QemuTotalMs != 900 || resp.DowntimeMs != 40 || resp.TotalMs != 2000 || resp.ReattestMs != 300 || !strings.Contains(string(resp.ClaimsJson), `"vcpus":2`) {
		t.Errorf("Migrate %+v", resp)
	}
	if m := sb.Calls("Migrate"); len(m) != 1 || !reflect.DeepEqual(m[0].Req, sandbox.MigrateOptions{Timeout: time.Minute, MaxBandwidth: 1 << 20}) {
		t.Errorf("Migrate reached the VM as %+v", m)
	}
	p, err := a.MigrationProgress(h.ctx, &adminapi.MigrationProgressRequest{})
	if err != nil || !p.Active || p.Status != "active" || p.Transferred != 10 || p.Remaining != 20 || p.Total != 30 || p.DirtyPagesRate != 4 || p.Mbps != 1.5 {
		t.Errorf("MigrationProgress %+v, %v", p, err)
	}
	sb.Fail("Migrate", errors.New("destination refused"))
	if _, err := a.Migrate(h.ctx, &adminapi.MigrateRequest{Destination: "/run/x.sock"}); !isClass(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "destination refused") {
		t.Errorf("failed migration: %v, want FailedPrecondition with the reason", errClass(err))
	}
}
