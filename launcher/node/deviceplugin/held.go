package deviceplugin

import (
	"context"

	"github.com/c8s-dev/c8s/launcher/node/deviceplugin/podres"
)

// Holder is a container holding a device.
type Holder = podres.Holder

// HeldDevices asks the kubelet's PodResources API which devices of
// resource the node's pods hold (podres.HeldDevices).
func HeldDevices(ctx context.Context, socket, resource string) (map[string]Holder, error) {
	return podres.HeldDevices(ctx, socket, resource)
}
