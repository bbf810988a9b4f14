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
