// Command containerd-shim-c8s-v2 is the c8s containerd shim (runtime type
// io.containerd.c8s.v2): it runs each pod in its own confidential VM.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/pkg/shim"

	"github.com/c8s-dev/c8s/shim/manager"
	_ "github.com/c8s-dev/c8s/shim/task/plugin"
)

func main() {
	// The shim starts QEMU with os/exec and waits for it itself, so the
	// generic reaper must not take its exits.
	shim.Run(context.Background(), manager.New(manager.RuntimeName), func(c *shim.Config) {
		c.NoReaper = true
		c.NoSubreaper = true
	})
}
