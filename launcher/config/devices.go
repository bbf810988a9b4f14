package config

// DefaultPodResourcesSocket is where the kubelet serves its PodResources
// API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Devices is the [devices] table: host devices for pod VMs. Every key is
// optional:
//
//	[devices]
//	pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"
//	gpu_cc_modes = "/etc/c8s/gpu-cc-modes"
//
// A pod VM starts before its containers, so the device-plugin allocations
// of those containers (nvidia.com/confidential-gpu) are not in anything
// the shim has been handed yet: the shim asks the kubelet's PodResources
// API which devices the pod holds, and cold-plugs them.
type Devices struct {
	// PodResourcesSocket is the kubelet's PodResources socket (empty:
	// DefaultPodResourcesSocket). When it does not exist the node has no
	// kubelet, and pods get no devices.
	PodResourcesSocket string `toml:"pod_resources_socket"`
	// GPUCCModes is the file provisioning records the GPUs' confidential-
	// computing modes in (empty: /etc/c8s/gpu-cc-modes; see
	// launcher/node/discovery, gpu.go).
	GPUCCModes string `toml:"gpu_cc_modes"`
}

// PodResources returns the PodResources socket to ask.
func (d Devices) PodResources() string {
	if d.PodResourcesSocket == "" {
		return DefaultPodResourcesSocket
	}
	return d.PodResourcesSocket
}
