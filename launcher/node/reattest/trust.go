package reattest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// NodeTrusts returns the Checker.Trusts of a node whose runtime.state_dir
// is stateRoot, as the shim's: for sim pods the node's simulated root and
// the trust pool's other roots (statedir.PoolRoots, a pod that migrated
// here), for snp and tdx the vendor's roots. Certificates are never
// fetched.
func NodeTrusts(stateRoot string) func(tee string) ([]attest.Trust, error) {
	return func(tee string) ([]attest.Trust, error) {
		own, err := attest.TrustFor(tee, statedir.SimSP(stateRoot))
		if err != nil {
			return nil, err
		}
		trusts := []attest.Trust{own}
		if own.Mode != attest.ModeSim {
			return trusts, nil
		}
		files, _ := filepath.Glob(filepath.Join(statedir.PoolRoots(stateRoot), "*.pem"))
		sort.Strings(files)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("trust pool root: %w", err)
			}
			trusts = append(trusts, attest.Trust{Mode: attest.ModeSim, SimCertChain: b})
		}
		return trusts, nil
	}
}
