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

func TestReserveUncounted(t *testing.T) {
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
		name     string
		use      Usage
		want     string
		reserved int64
	}{
		// Two pods hold devices, a third takes its unit as RuntimeClass
		// overhead: three counted, three VMs.
		{"all counted", Usage{HostUsed: 3, LiveVMs: 3, Counted: 3}, "+++++", 0},
		{"pods starting", Usage{HostUsed: 0, LiveVMs: 0, Counted: 3}, "+++++", 0},
		// Two more SNP VMs outside Kubernetes.
		{"foreign VMs", Usage{HostUsed: 5, LiveVMs: 3, Counted: 3}, "++--+", 2},
		// The pod of a VM is gone but its QEMU still runs, and the misc
		// cgroup is not readable.
		{"leaked VM", Usage{HostUsed: -1, LiveVMs: 4, Counted: 3}, "+++-+", 1},
		// Everything free is taken; held devices stay healthy.
		{"full", Usage{HostUsed: 9, LiveVMs: 2, Counted: 2}, "-+--+", 3},
	} {
		got, u := ReserveUncounted(devs, held, tc.use)
		if health(got) != tc.want || u.Reserved != tc.reserved || u.Devices != 5 || u.Held != 2 {
			t.Errorf("%s: %s (%+v), want %s (%d reserved)", tc.name, health(got), u, tc.want, tc.reserved)
		}
	}
	if health(devs) != "+++++" {
		t.Fatal("ReserveUncounted changed its input")
	}
}
