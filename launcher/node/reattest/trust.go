package reattest

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// NodeTrusts returns the Checker.Trusts of a node whose runtime.state_dir
// is stateRoot and whose attestation.collateral_dir is collateralDir (""
// for none), as the shim's: for sim pods the node's simulated root and the
// trust pool's other roots (statedir.PoolRoots, a pod that migrated here),
// for snp and tdx the vendor's roots with the offline collateral in
// collateralDir, loaded by the one loader of the shim, the broker and
// verify-report (attest.Trust.LoadCollateral): Intel's TCB info, quoting
// enclave identity and PCK CRLs for tdx, which judge each quote's platform
// TCB status and revocation, and AMD's CRLs for snp, which revoke chips'
// and signing keys' certificates. Certificates are never fetched.
//
// The directory is read at every check, so that collateral the operator
// refreshes (a new CRL, a new TCB info) counts at the next re-attestation
// without restarting the node agent; while its files are unchanged the
// collateral loaded before is reused, and with it the verifier (and the
// chains it verified). A directory that does not load is the node's
// failure to verify (Unknown, VerifierError), not the pod's.
func NodeTrusts(stateRoot, collateralDir string) func(tee string) ([]attest.Trust, error) {
	n := &nodeTrusts{stateRoot: stateRoot, collateralDir: collateralDir}
	return n.trusts
}

// nodeTrusts is NodeTrusts' state: the collateral last loaded, per mode.
type nodeTrusts struct {
	stateRoot, collateralDir string
	// now, when set, is the time certificates and collateral must be
	// valid at (tests: the fixtures' validity).
	now func() time.Time
	// roots, when set, replaces the vendor's roots (tests: a test-only
	// AMD signer); the collateral is added as to the vendor's.
	roots func(tee string) (attest.Trust, error)

	mu     sync.Mutex
	loaded map[attest.Mode]collateral
}

// collateral is what one load of the collateral directory gave.
type collateral struct {
	sum  [sha256.Size]byte // of the directory's files
	tdx  *attest.TDXCollateral
	crls [][]byte
}

func (n *nodeTrusts) trusts(tee string) ([]attest.Trust, error) {
	own, err := n.own(tee)
	if err != nil {
		return nil, err
	}
	if n.now != nil {
		own.Now = n.now
	}
	if own.Mode != attest.ModeSim {
		if n.collateralDir != "" {
			if err := n.collateral(&own); err != nil {
				return nil, fmt.Errorf("attestation.collateral_dir: %w", err)
			}
		}
		return []attest.Trust{own}, nil
	}
	trusts := []attest.Trust{own}
	files, _ := filepath.Glob(filepath.Join(statedir.PoolRoots(n.stateRoot), "*.pem"))
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("trust pool root: %w", err)
		}
		trusts = append(trusts, attest.Trust{Mode: attest.ModeSim, SimCertChain: b, Now: n.now})
	}
	return trusts, nil
}

// own returns the node's own roots for tee.
func (n *nodeTrusts) own(tee string) (attest.Trust, error) {
	if n.roots != nil {
		return n.roots(tee)
	}
	return attest.TrustFor(tee, statedir.SimSP(n.stateRoot))
}

// collateral adds the collateral directory's files to t: those loaded
// before while the files are the same, else loaded again.
func (n *nodeTrusts) collateral(t *attest.Trust) error {
	sum, err := dirSum(n.collateralDir)
	if err != nil {
		return t.LoadCollateral(n.collateralDir) // its error names the directory and the fix
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.loaded[t.Mode]; ok && c.sum == sum {
		t.TDXCollateral, t.AMDCRLs = c.tdx, c.crls
		return nil
	}
	if err := t.LoadCollateral(n.collateralDir); err != nil {
		return err
	}
	if n.loaded == nil {
		n.loaded = map[attest.Mode]collateral{}
	}
	n.loaded[t.Mode] = collateral{sum: sum, tdx: t.TDXCollateral, crls: t.AMDCRLs}
	return nil
}

// dirSum is a digest of the names and contents of dir's files.
func dirSum(dir string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	entries, err := os.ReadDir(dir)
	if err != nil {
		return sum, err
	}
	h := sha256.New()
	for _, e := range entries { // sorted by name
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return sum, err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", e.Name(), len(b))
		h.Write(b)
	}
	h.Sum(sum[:0])
	return sum, nil
}
