package sandbox

import (
	"testing"

	"github.com/c8s-dev/c8s/launcher/node/deviceplugin"
)

// The node agent finds live pod VMs by the pid file the shim writes: the
// names must stay equal (the shim does not import the node agent's
// packages, to keep its memory small).
func TestPidFileIsWhatTheNodeAgentScans(t *testing.T) {
	if PidFile != deviceplugin.PidFile {
		t.Fatalf("shim writes %q, the node agent scans for %q", PidFile, deviceplugin.PidFile)
	}
}
