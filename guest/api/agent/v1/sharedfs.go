package agent

// SharedFSTag is the virtio-fs tag of a pod's share of host paths
// (CreateContainerRequest.shared_mounts).
const SharedFSTag = "c8s-shared"
