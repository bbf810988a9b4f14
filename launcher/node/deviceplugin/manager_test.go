package deviceplugin

import (
	"context"
	"os"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestManagerFollowsTheResourceSet(t *testing.T) {
	dir := shortDir(t)
	k := startKubelet(t, dir)
	m := NewManager(context.Background(), dir)
	t.Cleanup(func() { _ = m.Stop() })

	if err := m.Update(map[string][]Device{
		"c8s.io/sim-slot": Devices("c8s.io/sim-slot", 2),
		"c8s.io/snp-asid": Devices("c8s.io/snp-asid", 4),
	}); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for range 2 {
		r := k.await(t)
		got[r.ResourceName] = r.Endpoint
	}
	if got["c8s.io/sim-slot"] != "c8s-sim-slot.sock" || got["c8s.io/snp-asid"] != "c8s-snp-asid.sock" {
		t.Fatalf("registrations = %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := dialPlugin(t, dir, "c8s-sim-slot.sock").ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if devs := recv(t, stream); len(devs) != 2 {
		t.Fatalf("sim slots = %v", devs)
	}

	// More sim slots, and SNP gone.
	snpSocket := m.Plugin("c8s.io/snp-asid").SocketPath()
	if err := m.Update(map[string][]Device{"c8s.io/sim-slot": Devices("c8s.io/sim-slot", 3)}); err != nil {
		t.Fatal(err)
	}
	if devs := recv(t, stream); len(devs) != 3 || devs["sim-slot-2"] != pluginapi.Healthy {
		t.Fatalf("sim slots after the update = %v", devs)
	}
	if m.Plugin("c8s.io/snp-asid") != nil {
		t.Fatal("the SNP plugin still runs")
	}
	if _, err := os.Stat(snpSocket); !os.IsNotExist(err) {
		t.Fatalf("the SNP plugin's socket is still there: %v", err)
	}
	// A resource name without a domain is reported.
	if err := m.Update(map[string][]Device{"c8s.io/sim-slot": Devices("c8s.io/sim-slot", 3), "bad": nil}); err == nil {
		t.Fatal("a resource name without a domain was accepted")
	}
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.dir + "/c8s-sim-slot.sock"); !os.IsNotExist(err) {
		t.Fatalf("socket left after Stop: %v", err)
	}
}
