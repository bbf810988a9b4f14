// Package reattest keeps the trust in a node's running pod VMs while they
// run: the node agent's periodic re-attestation.
//
// A Monitor scans the node's running c8s pod VMs (Sandboxes) and, every
// Interval, and at once for a new pod or after a new bundle, asks each
// pod's shim for fresh evidence bound to a new nonce (the shim's Admin API
// Evidence). A Checker verifies it with launcher/attest against the
// reference values in force and, as the shim at start, the node's offline
// collateral (attestation.collateral_dir, NodeTrusts: Intel's TCB info,
// QE identity and CRLs, AMD's CRLs), then judges the verified fields
// against the minimum TCB and the revocations. The verdict becomes the pod's
// c8s.io/Attested condition (True, False with the reason, or Unknown when
// there was no evidence to judge) and, on a change, an event; where the
// policy says on_failure = "stop", the pod's sandbox is stopped through
// the container runtime (Runtime: CRI StopPodSandbox). When the node's own
// chip or TCB fails (revoked, or below the minimum), Node says so and the
// node agent withholds the node's capacity.
//
// The policy in force is the node's configuration (its image manifest and
// attestation.min_tcb), overridden and tightened by the owner's signed
// trust bundle (Bundle): reference values per TEE, a minimum TCB, and
// revoked chips, TCB versions, init data digests and launch digests. A
// Store takes bundles from a file or a ConfigMap (Source), signed with an
// owner key the node is configured with (Ed25519 or ECDSA P-256, a
// compact JWS of type BundleType); a bad signature, a malformed bundle, an
// older serial or another bundle with the serial in force is refused and
// the bundle in force stays.
//
// # What this protects, and what not
//
// The monitor runs on the host. For snp and tdx pods the host is the
// adversary, and a host that wants to can stop re-attesting, ignore a
// bundle or never stop a pod: re-attestation serves an honest node
// operator and makes a revocation visible in Kubernetes; it is not a
// guarantee to the pod's owner. The owner's relying party, the key broker,
// must enforce freshness itself (short sessions and short-lived secrets,
// re-attesting on each renewal against the same revocations).
package reattest
