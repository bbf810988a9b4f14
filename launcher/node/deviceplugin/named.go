package deviceplugin

// DevicesFor returns the devices of a resource with n units: when ids is
// not nil the units are named pieces of hardware (the PCI addresses of
// nvidia.com/confidential-gpu), and the first n of ids are the devices;
// otherwise they are interchangeable tokens (Devices).
//
// A GPU's device ID is its PCI address, so Allocate hands the container
// C8S_CONFIDENTIAL_GPU=0000:41:00.0 and the annotation
// nvidia.com/confidential-gpu=0000:41:00.0, like the TEE resources' IDs.
// The pod VM is started before its containers are created, so the shim
// does not wait for those: it asks the kubelet's PodResources API which
// devices the pod holds when it starts the VM (shim/task, gpu.go), as Kata
// does for cold-plugged VFIO devices. Allocate returns no DeviceSpecs: the
// VFIO device nodes are the shim's and QEMU's on the host, and a device
// node in the container's spec would only name a host path inside the VM.
func DevicesFor(resource string, n int64, ids []string) []Device {
	if ids == nil {
		return Devices(resource, n)
	}
	n = max(0, min(n, int64(len(ids))))
	out := make([]Device, 0, n)
	for _, id := range ids[:n] {
		out = append(out, Device{ID: id, Healthy: true})
	}
	return out
}
