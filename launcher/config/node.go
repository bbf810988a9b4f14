package config

// DefaultTaint keeps ordinary pods off nodes with confidential capacity.
const DefaultTaint = "c8s.io/confidential=true:NoSchedule"

// Node is the [node] table: what the node agent tells Kubernetes about
// this node. Every key is optional:
//
//	[node]
//	sim_slots = 4          # sim pod VMs offered: N, 0 = from host memory, -1 = none
//	trust_pool = "prod-a"  # value of the c8s.io/trust-pool label (default: the node's TEE)
//	taint = "c8s.io/confidential=true:NoSchedule"   # "" for no taint
type Node struct {
	// SimSlots is the number of sim pod VMs the node offers (the
	// c8s.io/sim-slot extended resource): > 0 exactly that many, 0 derived
	// from host memory and hypervisor.default_memory, -1 none.
	SimSlots int `toml:"sim_slots"`
	// TrustPool names the group of nodes that share an attestation root and
	// policy; published as the c8s.io/trust-pool label.
	TrustPool string `toml:"trust_pool"`
	// Taint is put on nodes with confidential capacity, as
	// "key=value:Effect" or "key:Effect"; empty for none.
	Taint string `toml:"taint"`
}
