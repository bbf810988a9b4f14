// Package packaging holds the files c8s installs on a node: the containerd
// drop-in that registers the runtime handler, the default c8s config, and
// the Kubernetes manifest (kubernetes/c8s.yaml: the node-installer
// DaemonSet and the RuntimeClass). Their rendered forms are golden-tested
// here; launcher/admin/install installs them. kubernetes/runtimeclasses.yaml
// holds the per-TEE RuntimeClasses c8s-sim, c8s-snp and c8s-tdx, whose
// handlers the drop-in registers, each with its own config (Configs);
// kubernetes/runtimeclasses-gpu.yaml the classes for pods with confidential
// GPUs (c8s-sim-gpu, c8s-snp-gpu, c8s-tdx-gpu) on the same handlers.
// kubernetes/node-agent.yaml runs `c8s-launcher node-agent` as a DaemonSet
// with the RBAC it needs (get and patch its Node and the Node's status).
package packaging
