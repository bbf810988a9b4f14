package podres

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

type fakePodResources struct {
	podresources.UnimplementedPodResourcesListerServer
	resp *podresources.ListPodResourcesResponse
}

func (f *fakePodResources) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	return f.resp, nil
}

func TestHeldDevicesFromThePodResourcesAPI(t *testing.T) {
	socket := filepath.Join(shortDir(t), "kubelet.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	dev := func(res string, ids ...string) *podresources.ContainerDevices {
		return &podresources.ContainerDevices{ResourceName: res, DeviceIds: ids}
	}
	podresources.RegisterPodResourcesListerServer(srv, &fakePodResources{resp: &podresources.ListPodResourcesResponse{
		PodResources: []*podresources.PodResources{
			{Namespace: "default", Name: "a", Containers: []*podresources.ContainerResources{
				{Name: "app", Devices: []*podresources.ContainerDevices{dev("c8s.io/sim-slot", "sim-slot-0"), dev("example.com/gpu", "gpu-0")}},
				{Name: "side", Devices: []*podresources.ContainerDevices{dev("c8s.io/sim-slot", "sim-slot-3")}},
			}},
			{Namespace: "ci", Name: "b", Containers: []*podresources.ContainerResources{{Name: "app"}}},
		},
	}})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)

	held, err := HeldDevices(context.Background(), socket, "c8s.io/sim-slot")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Holder{
		"sim-slot-0": {Namespace: "default", Pod: "a", Container: "app"},
		"sim-slot-3": {Namespace: "default", Pod: "a", Container: "side"},
	}
	if !reflect.DeepEqual(held, want) {
		t.Fatalf("held = %v", held)
	}
	if _, err := HeldDevices(context.Background(), filepath.Join(filepath.Dir(socket), "none.sock"), "c8s.io/sim-slot"); err == nil || !strings.Contains(err.Error(), "kubelet running") {
		t.Fatalf("no kubelet: %v", err)
	}
}

func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "c8s-podres-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
