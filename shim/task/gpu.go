package task

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/deviceplugin/podres"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// Confidential GPUs reach a pod VM by cold-plug: the kubelet allocates
// nvidia.com/confidential-gpu devices (named by PCI address, see
// launcher/node/deviceplugin) to the pod's containers when it admits the
// pod, before it creates the sandbox; the VM starts with the sandbox, so
// those containers' specs have not arrived yet. The shim therefore asks
// the kubelet's PodResources API (devices.pod_resources_socket) which
// devices the pod holds, re-checks each GPU on the host (CC mode on,
// vfio-pci, a viable IOMMU group: what the device plugin advertised may
// have changed since), and gives them to the VM on PCIe root ports.
//
// The devices are the host's choice, so for snp and tdx pods they are
// untrusted until the guest has verified them: a GPU proves what it is,
// and that its CC mode is on, through its attestation report, which the
// owner's key broker checks before it releases secrets (launcher/broker,
// gpu.go).

// CRI annotations naming a sandbox's Kubernetes pod.
const (
	sandboxNameAnnotation      = "io.kubernetes.cri.sandbox-name"
	sandboxNamespaceAnnotation = "io.kubernetes.cri.sandbox-namespace"
)

// k8sPod names a Kubernetes pod.
type k8sPod struct{ Namespace, Name string }

// k8sPodOf returns the Kubernetes pod a container's annotations name (the
// zero value for a container outside Kubernetes).
func k8sPodOf(ann map[string]string) k8sPod {
	return k8sPod{Namespace: ann[sandboxNamespaceAnnotation], Name: ann[sandboxNameAnnotation]}
}

// gpuSysRoot is where the shim reads sysfs and /dev to check a GPU ("/";
// a fixture tree in tests).
var gpuSysRoot = "/"

// podGPUs returns the VFIO devices of the confidential GPUs the kubelet
// allocated to pod, in PCI address order; none for a pod outside
// Kubernetes or a node without a kubelet. A GPU that is not fit to pass
// to a VM fails the pod, naming what is wrong.
func podGPUs(ctx context.Context, cfg config.Config, pod k8sPod) ([]vm.VFIODevice, error) {
	if pod.Name == "" || pod.Namespace == "" {
		return nil, nil
	}
	socket := cfg.Devices.PodResources()
	if _, err := os.Stat(socket); errors.Is(err, fs.ErrNotExist) {
		log.G(ctx).Debugf("no kubelet PodResources socket at %s: no devices for pod %s/%s", socket, pod.Namespace, pod.Name)
		return nil, nil
	}
	held, err := podres.HeldDevices(ctx, socket, labels.ResourceConfidentialGPU)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: which GPUs the kubelet allocated: %w: %w", pod.Namespace, pod.Name, err, errdefs.ErrUnavailable)
	}
	var addrs []string
	for id, h := range held {
		if h.Namespace == pod.Namespace && h.Pod == pod.Name {
			addrs = append(addrs, id)
		}
	}
	if len(addrs) == 0 {
		return nil, nil
	}
	sort.Strings(addrs)
	gpus, err := discovery.DiscoverGPUs(gpuSysRoot, cfg.Devices.GPUCCModes)
	if err != nil {
		return nil, err
	}
	var devs []vm.VFIODevice
	for _, a := range addrs {
		g, ok := gpus.Find(a)
		switch {
		case !discovery.ValidPCIAddress(a):
			return nil, fmt.Errorf("pod %s/%s was allocated %s %q, which is not a PCI address: %w", pod.Namespace, pod.Name, labels.ResourceConfidentialGPU, a, errdefs.ErrFailedPrecondition)
		case !ok:
			return nil, fmt.Errorf("pod %s/%s was allocated GPU %s, which is not an NVIDIA GPU on this host (/sys/bus/pci/devices/%s): %w", pod.Namespace, pod.Name, a, a, errdefs.ErrFailedPrecondition)
		case !g.Usable:
			return nil, fmt.Errorf("pod %s/%s was allocated GPU %s, which cannot go to a confidential pod: %s: %w", pod.Namespace, pod.Name, a, g.Reason, errdefs.ErrFailedPrecondition)
		}
		devs = append(devs, vm.VFIODevice{Host: a, IOMMUFD: gpus.IOMMUFD && g.CDev != "", Mem64Bytes: g.Mem64Bytes()})
	}
	log.G(ctx).WithField("gpus", addrs).Infof("pod %s/%s: cold-plugging its confidential GPUs", pod.Namespace, pod.Name)
	return devs, nil
}
