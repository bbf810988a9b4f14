package sim

import (
	"reflect"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
)

func TestBackend(t *testing.T) {
	h := config.Default().Hypervisor
	p, err := Backend{}.QEMU(h)
	want := tee.Pieces{Firmware: Firmware, KernelParams: []string{"c8s.tee=sim"}, Ports: []string{AttestPort, tee.KBSPort},
		Args: []string{"-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on"}}
	if err != nil || !reflect.DeepEqual(p, want) {
		t.Fatalf("sim without firmware = %+v, %v; want %+v", p, err, want)
	}
	h.Firmware = "/fw.fd"
	if p, _ := (Backend{}).QEMU(h); p.Firmware != "/fw.fd" || p.RequiresKVM {
		t.Fatalf("sim with firmware = %+v", p)
	}
}
