package labels

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/c8s-dev/c8s/launcher/node/discovery"
)

func gpuResult(t *testing.T, fixture string, sim int) discovery.Result {
	t.Helper()
	r, err := discovery.Discover(discovery.Options{Root: filepath.Join("..", "discovery", "testdata", fixture), SimSlots: sim})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDesireGPUs(t *testing.T) {
	d := Desire(gpuResult(t, "gpu-one", 1), Settings{Taint: defaultTaint})
	for k, v := range map[string]string{LabelGPUCCCapable: "true", LabelGPUCCModeState: "on", LabelGPUProduct: "NVIDIA-H100-SXM5-80GB"} {
		if d.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, d.Labels[k], v)
		}
	}
	want := []Resource{{Name: ResourceSimSlot, Count: 1, DevicePlugin: true}, {Name: ResourceConfidentialGPU, Count: 1, DevicePlugin: true}}
	if !reflect.DeepEqual(d.Resources, want) {
		t.Fatalf("resources %+v, want %+v", d.Resources, want)
	}
	if ids := DeviceIDs(gpuResult(t, "gpu-host", 1), ResourceConfidentialGPU); !reflect.DeepEqual(ids, []string{"0000:41:00.0", "0000:c1:00.0"}) {
		t.Fatalf("device IDs %v", ids)
	}
	if ids := DeviceIDs(gpuResult(t, "gpu-host", 1), ResourceSimSlot); ids != nil {
		t.Fatalf("sim slots named %v", ids)
	}

	// Withheld: no GPU either, the hardware labels stay.
	w := Withhold(d, "Revoked")
	for _, r := range w.Resources {
		if r.Count != 0 {
			t.Fatalf("withheld node advertises %+v", r)
		}
	}
	if w.Labels[LabelGPUCCCapable] != "true" {
		t.Fatalf("withheld labels %v", w.Labels)
	}

	// Without pod VMs there is nothing to put a GPU in: labels, no
	// resource, no taint.
	d = Desire(gpuResult(t, "gpu-one", -1), Settings{Taint: defaultTaint})
	if len(d.Resources) != 0 || d.Taint != nil || d.Labels[LabelGPUCCCapable] != "true" {
		t.Fatalf("GPU-only node: %+v", d)
	}
	// No GPU: no GPU label.
	d = Desire(gpuResult(t, "plain-host", 1), Settings{})
	if _, ok := d.Labels[LabelGPUCCCapable]; ok {
		t.Fatalf("labels %v", d.Labels)
	}
}

func TestProductLabel(t *testing.T) {
	for in, want := range map[string]string{
		"H100 SXM5 80GB":      "NVIDIA-H100-SXM5-80GB",
		"GH200 120GB / 480GB": "NVIDIA-GH200-120GB-480GB",
		"":                    "",
	} {
		if got := ProductLabel(in); got != want || (got != "" && !validValue(got)) {
			t.Errorf("ProductLabel(%q) = %q, want %q", in, got, want)
		}
	}
}
