package attest

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/c8s-dev/c8s/manifest"
)

// TrustFor returns the trust configuration of a node running TEE tee
// ("sim", "snp" or "tdx"); simSPDir is where a sim node keeps its
// simulated secure processor (launcher/vm/tee/sim.Open).
func TrustFor(tee, simSPDir string) (Trust, error) {
	switch tee {
	case "sim":
		return SimTrust(simSPDir)
	case "snp":
		return Trust{Mode: ModeSNP}, nil
	case "tdx":
		return Trust{Mode: ModeTDX}, nil
	}
	return Trust{}, fmt.Errorf("attest: no verifier for TEE %q", tee)
}

// PolicyFromManifest returns what a VM of TEE tee with vcpus vCPUs,
// launched from image manifest m, must show, but for its init data, the
// nonce and the node's settings: the launch digest of its shape (snp,
// sim) or its MRTD (tdx), and its measured boot (BootPolicy). The shim
// checks a pod with it at start, the node agent's re-attestation while
// it runs.
func PolicyFromManifest(m *manifest.Manifest, tee string, vcpus int) (*Policy, error) {
	p, err := BootPolicy(m, tee)
	if err != nil || tee == "tdx" {
		return p, err
	}
	expected, err := ExpectedMeasurements(m, tee)
	if err != nil {
		return nil, err
	}
	if _, ok := expected[vcpus]; !ok {
		return nil, fmt.Errorf("the image manifest has no %s launch digest for %d vCPUs (it has %s): add the shape to the image build or change the pod's vCPUs", tee, vcpus, Shapes(expected))
	}
	p.Measurements, p.VCPUs = expected, vcpus
	return p, nil
}

// BootPolicy returns the measured boot a VM of TEE tee launched from
// image manifest m must show (Policy.TDXBoot, Policy.RTMRs): on tdx the
// MRTD, the CC event log's kernel, command line and initrd and the
// RTMRs (TDXPolicyFromManifest); in the sim TEE, which models TDX's
// RTMRs, the boot log's kernel, command line and initrd where the
// manifest records them (digests.sim.boot: images whose kernel is an
// EFI-stub PE). On snp the launch digest covers the boot: none.
func BootPolicy(m *manifest.Manifest, tee string) (*Policy, error) {
	switch tee {
	case "tdx":
		d, err := m.TDX()
		if err != nil {
			return nil, err
		}
		return TDXPolicyFromManifest(d)
	case "sim":
		d, err := m.Sim()
		if err != nil {
			return nil, err
		}
		boot, err := BootFromManifest(d.Boot, d.Cmdline)
		if err != nil {
			return nil, err
		}
		return &Policy{TDXBoot: boot}, nil
	}
	return &Policy{}, nil
}

// ExpectedMeasurements returns the launch digests an image manifest
// accepts for TEE tee, by vCPU count.
func ExpectedMeasurements(m *manifest.Manifest, tee string) (map[int]Hex, error) {
	var byVCPUs map[string]string
	switch tee {
	case "sim":
		d, err := m.Sim()
		if err != nil {
			return nil, err
		}
		byVCPUs = d.ByVCPUs
	case "snp":
		d, err := m.SNP()
		if err != nil {
			return nil, err
		}
		byVCPUs = d.ByVCPUs
	default:
		return nil, fmt.Errorf("attest: the image manifest has no %s launch digests: compute them with c8s-measure and add them, or set attestation.mode = \"off\" for development", tee)
	}
	out := map[int]Hex{}
	for k, v := range byVCPUs {
		n, err := strconv.Atoi(k)
		if err != nil {
			return nil, fmt.Errorf("attest: manifest vCPU count %q: %w", k, err)
		}
		h, err := ParseHex(v)
		if err != nil {
			return nil, fmt.Errorf("attest: manifest digest for %d vCPUs: %w", n, err)
		}
		out[n] = h
	}
	return out, nil
}

// Shapes lists the vCPU counts of a measurement set, for messages.
func Shapes(ms map[int]Hex) string {
	var ns []int
	for n := range ms {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
