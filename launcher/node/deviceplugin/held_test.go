package deviceplugin

import (
	"strings"
	"testing"
)

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
