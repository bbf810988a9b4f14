package config

import (
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
)

// Attestation modes accepted in attestation.mode.
const (
	// AttestRequired: a pod is reported started only after fresh evidence
	// from its VM has verified against the expected launch digests.
	AttestRequired = "required"
	// AttestOff skips the check: for development only.
	AttestOff = "off"
)

// AttestModes lists the valid attestation.mode values.
var AttestModes = []string{AttestRequired, AttestOff}

// Attestation configures how the node verifies its pods.
type Attestation struct {
	// Mode is AttestRequired (default) or AttestOff.
	Mode string `toml:"mode"`
	// Manifest is the image manifest holding the expected launch digests;
	// empty means manifest.json beside hypervisor.kernel.
	Manifest string `toml:"manifest"`
	// InitData is the file holding the init data of pods that do not set
	// their own (annotation io.c8s.initdata); empty means none.
	InitData string `toml:"initdata"`
	// MinTCB is the minimum SNP TCB_VERSION (the 64-bit value, compared
	// component by component with REPORTED_TCB); 0 checks none.
	MinTCB uint64 `toml:"min_tcb"`
	// CollateralDir is a directory of offline collateral, as `c8s-launcher
	// collateral fetch --out DIR` writes it where a network exists (for
	// example /var/lib/c8s/collateral). When set, the shim verifies a tdx
	// pod's platform TCB status, quoting enclave identity and PCK
	// revocation with Intel's files in it, and an snp pod's certificates
	// against AMD's CRLs in it; a TCB status, QE identity or CRL past its
	// next update then fails attestation until the directory is
	// refreshed. A set directory that is missing fails every snp and tdx
	// pod's attestation, naming this key. Empty checks none of these (the
	// quote's and report's signatures and the policy still are). The sim
	// TEE ignores it.
	CollateralDir string `toml:"collateral_dir"`
	// AllowDebug accepts VMs launched with debugging enabled. Never in
	// production: the host can read a debug VM's memory.
	AllowDebug bool `toml:"allow_debug"`
	// NodeLaunchDigests are the launch digests (hex: the SNP MEASUREMENT or
	// the TDX MRTD, 48 bytes) the node itself may have when it runs as a
	// confidential VM (node-as-CVM); the node agent publishes its own
	// digest as matched only when it is one of them. Empty publishes the
	// verified digest without comparing it to a reference. MinTCB and
	// AllowDebug apply to the node's own evidence too.
	NodeLaunchDigests []string `toml:"node_launch_digests"`
}

// launchDigestSize is the size of an SNP MEASUREMENT and a TDX MRTD.
const launchDigestSize = 48

// ManifestPath returns attestation.manifest or its default.
func (c *Config) ManifestPath() string {
	if c.Attestation.Manifest != "" {
		return c.Attestation.Manifest
	}
	return filepath.Join(filepath.Dir(c.Hypervisor.Kernel), "manifest.json")
}

func (a Attestation) validate() error {
	if !contains(AttestModes, a.Mode) {
		return fmt.Errorf("attestation.mode %q is not valid; use one of: %s", a.Mode, strings.Join(AttestModes, ", "))
	}
	if a.CollateralDir != "" && !filepath.IsAbs(a.CollateralDir) {
		return fmt.Errorf("attestation.collateral_dir %q is not an absolute path: give the directory `c8s-launcher collateral fetch --out DIR` wrote", a.CollateralDir)
	}
	for i, d := range a.NodeLaunchDigests {
		b, err := hex.DecodeString(strings.TrimPrefix(d, "0x"))
		if err != nil || len(b) != launchDigestSize {
			return fmt.Errorf("attestation.node_launch_digests[%d] %q is not a %d-byte hex digest (an SNP MEASUREMENT or TDX MRTD)", i, d, launchDigestSize)
		}
	}
	return nil
}
