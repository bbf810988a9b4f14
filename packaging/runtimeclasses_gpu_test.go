package packaging

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
)

// gpuIOMMUOverheadMiB is the GPU classes' allowance for the IOMMU page
// tables of the pinned guest memory, QEMU's VFIO state and headroom.
const gpuIOMMUOverheadMiB = 128

// TestGPURuntimeClasses: one GPU class per TEE, on that TEE's handler,
// with the TEE class's scheduling plus nvidia.com/cc.capable, and a
// memory overhead of the TEE class's plus the handler config's whole
// guest memory (VFIO pins it) plus the IOMMU allowance.
func TestGPURuntimeClasses(t *testing.T) {
	out, err := Render("kubernetes/runtimeclasses-gpu.yaml", paths)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "kubernetes/runtimeclasses-gpu.yaml", out)
	base, err := Render("kubernetes/runtimeclasses.yaml", paths)
	if err != nil {
		t.Fatal(err)
	}
	teeClass := map[string]runtimeClass{}
	for _, doc := range strings.Split(base, "\n---\n") {
		var rc runtimeClass
		if err := yaml.UnmarshalStrict([]byte(doc), &rc); err != nil {
			t.Fatal(err)
		}
		teeClass[rc.Metadata.Name] = rc
	}
	handlers := dropInHandlers(t)
	docs := strings.Split(out, "\n---\n")
	if len(docs) != len(config.TEENames) {
		t.Fatalf("%d GPU RuntimeClasses, want one per TEE", len(docs))
	}
	for _, doc := range docs {
		var rc runtimeClass
		if err := yaml.UnmarshalStrict([]byte(doc), &rc); err != nil {
			t.Fatalf("not a RuntimeClass: %v", err)
		}
		t.Run(rc.Metadata.Name, func(t *testing.T) {
			tee, ok := strings.CutSuffix(strings.TrimPrefix(rc.Metadata.Name, "c8s-"), "-gpu")
			if !ok || rc.Handler != "c8s-"+tee {
				t.Fatalf("name %q handler %q: want c8s-<tee>-gpu on handler c8s-<tee>", rc.Metadata.Name, rc.Handler)
			}
			tc, ok := teeClass[rc.Handler]
			if !ok {
				t.Fatalf("no TEE class %s", rc.Handler)
			}
			cfgPath := handlers[rc.Handler]
			rendered, err := Render(strings.TrimPrefix(cfgPath, "/etc/"), paths)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Parse([]byte(rendered))
			if err != nil {
				t.Fatal(err)
			}
			if rc.Scheduling == nil || len(rc.Scheduling.NodeSelector) != 2 || rc.Scheduling.NodeSelector[teeLabel[tee]] != "true" ||
				rc.Scheduling.NodeSelector[labels.LabelGPUCCCapable] != "true" {
				t.Fatalf("nodeSelector %+v", rc.Scheduling)
			}
			if fmt.Sprint(rc.Scheduling.Tolerations) != fmt.Sprint(tc.Scheduling.Tolerations) {
				t.Fatalf("tolerations %+v, want the TEE class's %+v", rc.Scheduling.Tolerations, tc.Scheduling.Tolerations)
			}
			pf := rc.Overhead.PodFixed
			wantMem := fmt.Sprintf("%dMi", discovery.DefaultSlotOverheadMiB+int(cfg.Hypervisor.DefaultMemoryMiB)+gpuIOMMUOverheadMiB)
			if pf["memory"] != wantMem || tc.Overhead.PodFixed["memory"] != fmt.Sprintf("%dMi", discovery.DefaultSlotOverheadMiB) {
				t.Errorf("overhead memory %q, want %s (%d MiB pod VM + %d MiB pinned guest memory + %d MiB)", pf["memory"], wantMem,
					discovery.DefaultSlotOverheadMiB, cfg.Hypervisor.DefaultMemoryMiB, gpuIOMMUOverheadMiB)
			}
			gpuCPU, tcCPU := resource.MustParse(pf["cpu"]), resource.MustParse(tc.Overhead.PodFixed["cpu"])
			if gpuCPU.Cmp(tcCPU) <= 0 {
				t.Errorf("cpu overhead %s not above the TEE class's %s", pf["cpu"], tc.Overhead.PodFixed["cpu"])
			}
			if pf[keyResource[tee]] != "1" || len(pf) != 3 {
				t.Errorf("overhead %v, want memory, cpu and one %s", pf, keyResource[tee])
			}
			if _, ok := pf[labels.ResourceConfidentialGPU]; ok {
				t.Error("the GPU is in the overhead: the kubelet allocates devices only for container requests")
			}
		})
	}
}
