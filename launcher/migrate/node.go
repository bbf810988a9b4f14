// Package migrate moves a running pod VM from one node to another with
// QEMU live migration, re-attests it on the destination before it counts
// as resumed there, and rolls back to the source on any failure.
//
// The flow (Run, on the source node):
//
//  1. Preflight: the destination (NodeInfo from its Server) is in the same
//     trust pool ([node] trust_pool, the c8s.io/trust-pool label), runs the
//     same TEE with a TCB that meets the pod's policy, can host the shape and
//     has the same guest image (kernel, initrd, firmware digests).
//  2. Incoming, sent while the source runs its preflight: the destination's
//     Server runs the same preflight, gives the VM its disks (image layers
//     from its own layer cache, found or converted by diff ID and checked
//     against the source's dm-verity roots, layers.go; other disks below
//     its migration.shared_storage_root, storage.go), starts QEMU with the
//     same machine and `-incoming defer` (in sim, with the launch
//     measurement its server made ahead, server.go warmLaunch), loads its
//     TLS identity into it (stream.go), then migrate-incoming on a TCP
//     port. The VM is bound to the caller (peer.go). A failed source
//     preflight destroys it again. Meanwhile the source QEMU loads the
//     source node's TLS identity (preloadSourceCreds).
//  3. Migrate: Options.Ready lets the caller prepare the re-attestation
//     (the shim dials the destination VM's agent channel); the source puts
//     the stream under its TLS identity, migrates, and polls query-migrate
//     (progress to Options.Progress) until QEMU's MIGRATION event or a
//     poll shows the end, within Options.Timeout.
//  4. Re-attest: Options.Reattest verifies fresh evidence from the VM on
//     the destination (the shim does it: fresh nonce, destination chip,
//     pool root, same measurement and HOST_DATA).
//  5. Cut over: only then does Run return success; the caller moves its
//     agent connection and stops the source QEMU.
//
// Rollback: whatever fails (the destination dies, migrate_cancel, timeout,
// the connection is cut, re-attestation fails), Run cancels the outgoing
// migration, destroys the destination VM and resumes the source (cont,
// also from postmigrate); its error names the cause.
//
// Confidential hardware: SEV-SNP and TDX guests need a migration helper
// (SNP) or MigTD (TDX) that upstream QEMU and KVM do not have. Run refuses
// them unless QEMU lists a capability registered in CVMMigrationCapability.
//
// The destination API is HTTP/JSON on a unix socket (0600: local root
// only); after the move the source's shim reaches the VM's agent channel
// through it (an Upgrade tunnel), never through the destination's file
// system. Between hosts the API is served with mutual TLS (tls.go, one CA
// per trust pool); QEMU's migration stream is TLS with the same
// certificates, plain TCP only on loopback when both nodes allow it, and a
// VM answers only the caller that moved it. Storage is not migrated: image
// layer disks come from the destination's own layer cache, where it holds
// a reference for the VM until it stops (the source's shim drops its own
// once the VM runs there); other disks must be on storage both nodes see,
// below the destination's migration.shared_storage_root.
package migrate

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/google/go-sev-guest/kds"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// NodeInfo is what a node tells a migration peer about itself.
type NodeInfo struct {
	// Name identifies the node (its host name unless configured).
	Name string `json:"name"`
	// TrustPool is [node] trust_pool, defaulting to the TEE's name as the
	// node agent's c8s.io/trust-pool label does.
	TrustPool string `json:"trust_pool"`
	// TEE is hypervisor.tee.
	TEE string `json:"tee"`
	// TCB is the node's SNP TCB_VERSION (sim: the simulated one); 0 when
	// unknown.
	TCB uint64 `json:"tcb"`
	// ChipID is the hex chip id of the node's (simulated) secure processor.
	ChipID string `json:"chip_id,omitempty"`
	// Images are the sha256 digests of the guest image files, by role:
	// kernel, initrd, firmware.
	Images map[string]string `json:"images"`
	// MemoryAvailableMiB is the host memory available for another VM.
	MemoryAvailableMiB uint64 `json:"memory_available_mib"`
	// CPUs is the number of host CPUs.
	CPUs int `json:"cpus"`
	// Accel is the accelerator the node's pod VMs run with.
	Accel string `json:"accel,omitempty"`
}

// TrustPool returns the node's trust pool name.
func TrustPool(cfg config.Config) string {
	if cfg.Node.TrustPool != "" {
		return cfg.Node.TrustPool
	}
	return cfg.Hypervisor.TEE
}

// LocalNode describes the node configured by cfg. name may be empty (the
// host name is used).
func LocalNode(cfg config.Config, name string) (NodeInfo, error) {
	if name == "" {
		name, _ = os.Hostname()
	}
	h := cfg.Hypervisor
	n := NodeInfo{Name: name, TrustPool: TrustPool(cfg), TEE: h.TEE, CPUs: runtime.NumCPU(), Accel: h.Accel}
	imgs, err := ImageDigests(h)
	if err != nil {
		return n, err
	}
	// A sealed image's root: its dm-verity root hash stands for every block.
	root, err := vm.RootFor(&cfg)
	if err != nil {
		return n, err
	}
	if root != nil {
		imgs["rootfs"] = root.RootHash
	}
	n.Images = imgs
	n.MemoryAvailableMiB = memAvailableMiB()
	if h.TEE == "sim" {
		sp, err := sim.Open(statedir.SimSP(cfg.Runtime.StateDir))
		if err != nil {
			return n, err
		}
		id := sp.ChipID()
		n.ChipID = hex.EncodeToString(id[:])
		tcb, err := kds.ComposeTCBParts(sp.TCB())
		if err != nil {
			return n, err
		}
		n.TCB = uint64(tcb)
	}
	return n, nil
}

// ImageDigests hashes the guest image files a VM of h boots.
func ImageDigests(h config.Hypervisor) (map[string]string, error) {
	files := map[string]string{"kernel": h.Kernel, "initrd": h.Initrd}
	fw := h.Firmware
	if fw == "" && h.TEE == "sim" {
		fw = sim.Firmware
	}
	if fw != "" {
		files["firmware"] = fw
	}
	out := map[string]string{}
	for role, path := range files {
		d, err := fileDigest(path)
		if err != nil {
			return nil, fmt.Errorf("migrate: digest of the guest %s: %w", role, err)
		}
		out[role] = d
	}
	return out, nil
}

// digestCache avoids rehashing an unchanged image file per migration.
var digestCache sync.Map // key: path|size|mtime -> hex digest

func fileDigest(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	key := path + "|" + strconv.FormatInt(st.Size(), 10) + "|" + strconv.FormatInt(st.ModTime().UnixNano(), 10)
	if d, ok := digestCache.Load(key); ok {
		return d.(string), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	hsh := sha256.New()
	if _, err := io.Copy(hsh, f); err != nil {
		return "", err
	}
	d := hex.EncodeToString(hsh.Sum(nil))
	digestCache.Store(key, d)
	return d, nil
}

// memAvailableMiB reads MemAvailable from /proc/meminfo (0 if unknown).
func memAvailableMiB() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb / 1024
		}
	}
	return 0
}
