package sandbox

import (
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
)

// The shim's VMs die with the shim: containerd kills a shim that outlived
// its create deadline, and nothing else would stop that VM.
func TestVMSpecDiesWithTheShim(t *testing.T) {
	spec := VMSpec(Options{ID: "p", StateDir: t.TempDir(), Config: config.Default()}, nil, "tcg", "k8s.io")
	if !spec.DieWithParent {
		t.Error("the shim's VM spec does not die with the shim (vm.Spec.DieWithParent)")
	}
}
