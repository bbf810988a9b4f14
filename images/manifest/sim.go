package manifest

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// DigestsSim is the Digests key of the sim TEE's expected launch digests.
const DigestsSim = "sim"

// SimDigests are the launch digests the sim TEE's simulated secure
// processor reports for this image (measurements/sim), one per vCPU count:
// what a verifier pins for every pod shape it accepts.
type SimDigests struct {
	// Firmware is the -bios image the digests assume (path on the build
	// host and sha256); a node must boot the same bytes.
	Firmware FileDigest `json:"firmware"`
	// Cmdline is the full kernel command line the digests assume: the
	// launcher's built-in parameters with no hypervisor.kernel_params.
	Cmdline string `json:"cmdline"`
	// VCPUType names the vCPU signature in the VMSAs.
	VCPUType string `json:"vcpu_type"`
	// GuestFeatures is the SEV_FEATURES value of the VMSAs.
	GuestFeatures uint64 `json:"guest_features"`
	// ByVCPUs maps a vCPU count ("1", "2", ...) to the hex SHA-384 digest.
	ByVCPUs map[string]string `json:"by_vcpus"`
}

// FileDigest names a file and its sha256.
type FileDigest struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
}

// SetSim records the sim digests.
func (m *Manifest) SetSim(d SimDigests) error {
	raw, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if m.Digests == nil {
		m.Digests = map[string]json.RawMessage{}
	}
	m.Digests[DigestsSim] = raw
	return nil
}

// Sim returns the sim digests, or an error saying the image has none.
func (m *Manifest) Sim() (*SimDigests, error) {
	raw, ok := m.Digests[DigestsSim]
	if !ok {
		return nil, fmt.Errorf("manifest: no %q digests: rebuild the image with `make image`", DigestsSim)
	}
	var d SimDigests
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("manifest: digests.%s: %w", DigestsSim, err)
	}
	for k, v := range d.ByVCPUs {
		if n, err := strconv.Atoi(k); err != nil || n < 1 {
			return nil, fmt.Errorf("manifest: digests.%s.by_vcpus: key %q is not a vCPU count", DigestsSim, k)
		}
		if len(v) != 96 {
			return nil, fmt.Errorf("manifest: digests.%s.by_vcpus[%s]: %q is not a SHA-384 hex digest", DigestsSim, k, v)
		}
	}
	return &d, nil
}
