package vm

import (
	"context"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/internal/testguest"
)

func TestCheckQEMUFeatures(t *testing.T) {
	qemu := testguest.QEMU(t)
	ctx := context.Background()
	if err := CheckQEMUFeatures(ctx, qemu, nil); err != nil {
		t.Fatalf("no features: %v", err)
	}
	// Every QEMU the launcher supports has these object types.
	if err := CheckQEMUFeatures(ctx, qemu, []string{"rng-random", "memory-backend-ram"}); err != nil {
		t.Fatalf("basic object types: %v", err)
	}
	err := CheckQEMUFeatures(ctx, qemu, []string{"rng-random", "c8s-no-such-object"})
	if err == nil || !strings.Contains(err.Error(), "c8s-no-such-object") || strings.Contains(err.Error(), "rng-random") {
		t.Fatalf("missing object type: err = %v, want it to name only the missing type", err)
	}
}
