package attest

import (
	"errors"
	"fmt"
	"os"
)

// LoadCollateral adds the offline collateral in dir, a directory `c8s-launcher
// collateral fetch` wrote, to t: in ModeTDX Intel's (LoadTDXCollateral:
// TCB info, QE identity, PCK and root CRLs), in ModeSNP AMD's CRLs
// (LoadAMDCRLs), of which there must be at least one. The sim TEE has no
// collateral. It is the one loader of `verify-report --collateral`, the
// shim's attestation.collateral_dir and the broker's --collateral.
func (t *Trust) LoadCollateral(dir string) error {
	st, err := os.Stat(dir)
	if err == nil && !st.IsDir() {
		err = errors.New("not a directory")
	}
	if err != nil {
		return failure(KindConfig, "collateral", fmt.Errorf("%s: %w", dir, err), collateralHint)
	}
	switch t.Mode {
	case ModeTDX:
		c, err := LoadTDXCollateral(dir)
		if err != nil {
			return err
		}
		t.TDXCollateral = c
	case ModeSNP:
		crls, err := LoadAMDCRLs(dir)
		if err != nil {
			return failure(KindConfig, "collateral", err, collateralHint)
		}
		if len(crls) == 0 {
			return failure(KindConfig, "collateral", fmt.Errorf("%s holds no AMD CRL (%s and the like)", dir, AMDCRLFile("Milan", false)), collateralHint+" --amd Milan,Genoa,Turin")
		}
		t.AMDCRLs = append(t.AMDCRLs, crls...)
	default:
		return failure(KindConfig, "collateral", fmt.Errorf("mode %s has no hardware collateral", t.Mode), "collateral is for the snp and tdx modes")
	}
	return nil
}

// collateralHint says how to make a collateral directory.
const collateralHint = "fetch it where a network exists: c8s-launcher collateral fetch --out DIR (--quote QUOTE for TDX, --amd PRODUCT_LINES for SNP), and copy DIR to the node"
