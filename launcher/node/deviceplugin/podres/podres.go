// Package podres asks the kubelet's PodResources API which devices the
// node's pods hold. It is split from launcher/node/deviceplugin so that the
// shim (shim/task's GPU admission) links only this client, not the device
// plugin server and the kubelet's deviceplugin API.
package podres

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResourcesSocket is where the kubelet serves its PodResources API.
const PodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Holder is a container holding a device.
type Holder struct {
	Namespace, Pod, Container string
}

func (h Holder) String() string { return h.Namespace + "/" + h.Pod + "/" + h.Container }

// HeldDevices asks the kubelet's PodResources API (socket, normally
// PodResourcesSocket) which devices of resource the node's pods hold
// right now. The kubelet reports a device for as long as the pod that was
// allocated it is alive, so this is the live view of which slots, ASIDs
// and keys are taken and by whom.
func HeldDevices(ctx context.Context, socket, resource string) (map[string]Holder, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+filepath.Clean(socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("podres: pod resources socket %s: %w", socket, err)
	}
	defer conn.Close()
	resp, err := podresources.NewPodResourcesListerClient(conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("podres: listing pod resources at %s: %w (is the kubelet running?)", socket, err)
	}
	held := map[string]Holder{}
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != resource {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					held[id] = Holder{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: c.GetName()}
				}
			}
		}
	}
	return held, nil
}
