package migrate

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/google/go-sev-guest/kds"
)

// Shape is the size of the pod VM to move.
type Shape struct {
	VCPUs     uint32 `json:"vcpus"`
	MemoryMiB uint32 `json:"memory_mib"`
}

// Refusal is a preflight's "no", with every reason.
type Refusal struct {
	Destination string
	Reasons     []string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("migration to node %s refused: %s", r.Destination, strings.Join(r.Reasons, "; "))
}

// Preflight decides whether the pod VM of shape, running on src and
// requiring a TCB of at least minTCB, may move to dst. It returns a
// *Refusal listing every reason, or nil.
func Preflight(src, dst NodeInfo, shape Shape, minTCB uint64) error {
	var why []string
	if dst.TrustPool != src.TrustPool {
		why = append(why, fmt.Sprintf("it is in trust pool %q, the pod's node %s is in %q (set [node] trust_pool)", dst.TrustPool, src.Name, src.TrustPool))
	}
	if dst.TEE != src.TEE {
		why = append(why, fmt.Sprintf("it runs TEE %s, the pod needs %s", dst.TEE, src.TEE))
	}
	if minTCB != 0 {
		min, got := kds.DecomposeTCBVersion(kds.TCBVersion(minTCB)), kds.DecomposeTCBVersion(kds.TCBVersion(dst.TCB))
		if !kds.TCBPartsLE(min, got) {
			why = append(why, fmt.Sprintf("its TCB %#x is below the pod's minimum %#x", dst.TCB, minTCB))
		}
	}
	if dst.MemoryAvailableMiB != 0 && uint64(shape.MemoryMiB) > dst.MemoryAvailableMiB {
		why = append(why, fmt.Sprintf("it has %d MiB of memory available, the pod VM needs %d MiB", dst.MemoryAvailableMiB, shape.MemoryMiB))
	}
	if dst.CPUs != 0 && int(shape.VCPUs) > dst.CPUs {
		why = append(why, fmt.Sprintf("it has %d CPUs, the pod VM has %d vCPUs", dst.CPUs, shape.VCPUs))
	}
	roles := make([]string, 0, len(src.Images))
	for r := range src.Images {
		roles = append(roles, r)
	}
	sort.Strings(roles)
	for _, role := range roles {
		if got, want := dst.Images[role], src.Images[role]; got != want {
			if got == "" {
				got = "none"
			}
			why = append(why, fmt.Sprintf("its guest %s has digest %s, the pod's is %s (install the same image)", role, short(got), short(want)))
		}
	}
	if len(why) > 0 {
		return &Refusal{Destination: dst.Name, Reasons: why}
	}
	return nil
}

func short(d string) string {
	if len(d) > 12 {
		return d[:12]
	}
	return d
}

// CVMMigrationCapability maps a confidential TEE to the QEMU migration
// capability (query-migrate-capabilities) that says QEMU can migrate its
// guests. No upstream QEMU has one: SEV-SNP needs a migration helper in
// the guest and KVM/QEMU support for it, TDX needs MigTD. Register the
// capability name here when a QEMU that has it is supported.
var CVMMigrationCapability = map[string]string{}

// CheckTEESupport refuses a confidential TEE unless qemuCaps (QEMU's
// migration capability names) include the one registered for it.
func CheckTEESupport(teeName, qemuVersion string, qemuCaps []string) error {
	switch teeName {
	case "sim":
		return nil
	case "snp", "tdx":
	default:
		return fmt.Errorf("migrate: unknown TEE %q", teeName)
	}
	need := CVMMigrationCapability[teeName]
	if need != "" {
		for _, c := range qemuCaps {
			if c == need {
				return nil
			}
		}
	}
	helper := map[string]string{"snp": "an SEV-SNP migration helper (guest-side migration agent and the KVM/QEMU SNP migration interface)", "tdx": "MigTD and TDX live-migration support in KVM/QEMU"}[teeName]
	return errors.New("migrate: QEMU " + qemuVersion + " does not report live-migration support for " + teeName +
		" guests: that needs " + helper + ", which upstream QEMU/KVM do not have; a confidential " + teeName +
		" pod cannot be live-migrated on this node (stop and restart it on the destination instead)")
}
