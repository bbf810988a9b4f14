package labels

import (
	"regexp"
	"strings"

	"github.com/c8s-dev/c8s/launcher/node/discovery"
)

// Confidential GPUs (see launcher/node/discovery, gpu.go).
//
//	nvidia.com/confidential-gpu  extended resource: one device per GPU that
//	                             can go to a confidential pod (CC mode on,
//	                             vfio-pci, a viable IOMMU group), named by
//	                             its PCI address
//	nvidia.com/cc.capable=true   the node has a GPU whose architecture
//	                             supports confidential computing
//	nvidia.com/cc.mode.state=on|off
//	                             every CC-capable GPU has CC mode on (off:
//	                             none has); absent when they differ
//	nvidia.com/gpu.product=NVIDIA-H100-SXM5-80GB
//	                             the first usable (else CC-capable) GPU's
//	                             model, from its PCI device ID
//
// The names are those of NVIDIA's GPU feature discovery and CC manager, so
// existing selectors work; like the NFD labels, c8s sets them only where
// no one else did (see Ownership in the package doc). c8s does not set
// nvidia.com/cc.mode: NVIDIA's CC manager reads that label as the mode an
// administrator asks for, and would switch the GPUs' mode to follow it.
const (
	ResourceConfidentialGPU = "nvidia.com/confidential-gpu"
	LabelGPUCCCapable       = "nvidia.com/cc.capable"
	LabelGPUCCModeState     = "nvidia.com/cc.mode.state"
	LabelGPUProduct         = "nvidia.com/gpu.product"
)

// desireGPUs adds the GPU labels to l and returns the GPU resource, if the
// node has usable GPUs.
func desireGPUs(l map[string]string, g discovery.GPUInfo) []Resource {
	var capable []discovery.GPU
	on := 0
	for _, x := range g.GPUs {
		if x.CCCapable {
			capable = append(capable, x)
			if x.CCMode == discovery.CCModeOn {
				on++
			}
		}
	}
	if len(capable) == 0 {
		return nil
	}
	l[LabelGPUCCCapable] = "true"
	switch on {
	case len(capable):
		l[LabelGPUCCModeState] = discovery.CCModeOn
	case 0:
		l[LabelGPUCCModeState] = discovery.CCModeOff
	}
	usable := g.Usable()
	named := capable
	if len(usable) > 0 {
		named = usable
	}
	if p := ProductLabel(named[0].Product); p != "" {
		l[LabelGPUProduct] = p
	}
	if len(usable) == 0 {
		return nil
	}
	return []Resource{{Name: ResourceConfidentialGPU, Count: int64(len(usable)), DevicePlugin: true}}
}

// DeviceIDs returns the device IDs the device plugin serves for resource
// when its units are named pieces of hardware: the usable GPUs' PCI
// addresses for ResourceConfidentialGPU. For the TEE resources, whose
// devices are interchangeable tokens, it returns nil.
func DeviceIDs(r discovery.Result, resource string) []string {
	if resource != ResourceConfidentialGPU {
		return nil
	}
	ids := []string{}
	for _, x := range r.GPU.Usable() {
		ids = append(ids, x.Address)
	}
	return ids
}

var notLabelChars = regexp.MustCompile(`[^A-Za-z0-9_.]+`)

// ProductLabel turns a pci.ids model name into a label value in the
// style of GPU feature discovery: "H100 SXM5 80GB" is
// NVIDIA-H100-SXM5-80GB ("" for an unknown model).
func ProductLabel(name string) string {
	if name == "" {
		return ""
	}
	v := "NVIDIA-" + strings.Trim(notLabelChars.ReplaceAllString(name, "-"), "-")
	if len(v) > 63 {
		v = strings.TrimRight(v[:63], "-_.")
	}
	return v
}
