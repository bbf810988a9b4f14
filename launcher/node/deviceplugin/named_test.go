package deviceplugin

import (
	"reflect"
	"testing"
)

func TestDevicesFor(t *testing.T) {
	ids := []string{"0000:41:00.0", "0000:c1:00.0"}
	if got := DevicesFor("nvidia.com/confidential-gpu", 2, ids); !reflect.DeepEqual(got, []Device{{"0000:41:00.0", true}, {"0000:c1:00.0", true}}) {
		t.Fatalf("%+v", got)
	}
	// A withheld node (count 0) serves none of its GPUs.
	if got := DevicesFor("nvidia.com/confidential-gpu", 0, ids); len(got) != 0 {
		t.Fatalf("%+v", got)
	}
	if got := DevicesFor("c8s.io/sim-slot", 2, nil); !reflect.DeepEqual(got, Devices("c8s.io/sim-slot", 2)) {
		t.Fatalf("%+v", got)
	}
}
