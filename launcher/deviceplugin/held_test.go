package deviceplugin

import (
	"context"
	"net"
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

func TestReserveForeignUse(t *testing.T) {
	devs := Devices("c8s.io/snp-asid", 5)
	held := map[string]Holder{"snp-asid-4": {Pod: "p"}, "snp-asid-1": {Pod: "q"}}
	health := func(ds []Device) string {
		var b strings.Builder
		for _, d := range ds {
			if d.Healthy {
				b.WriteByte('+')
			} else {
				b.WriteByte('-')
			}
		}
		return b.String()
	}
	for _, tc := range []struct {
		hostUsed int64
		want     string
		marked   int64
	}{
		{hostUsed: 2, want: "+++++", marked: 0}, // only the two pods
		{hostUsed: 0, want: "+++++", marked: 0}, // usage below what pods hold (pods starting)
		{hostUsed: 4, want: "++--+", marked: 2}, // two VMs outside Kubernetes
		{hostUsed: 9, want: "-+--+", marked: 3}, // every free device is taken; held ones stay
	} {
		got, marked := ReserveForeignUse(devs, held, tc.hostUsed)
		if health(got) != tc.want || marked != tc.marked {
			t.Errorf("host used %d: %s (%d marked), want %s (%d)", tc.hostUsed, health(got), marked, tc.want, tc.marked)
		}
	}
	if health(devs) != "+++++" {
		t.Fatal("ReserveForeignUse changed its input")
	}
}
