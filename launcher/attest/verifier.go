package attest

import (
	"crypto/sha256"
	"crypto/x509"
	_ "embed"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/go-sev-guest/verify/trust"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim/simtrust"
)

// Mode is the TEE whose evidence a Verifier accepts (verdict.Mode).
type Mode = verdict.Mode

// The modes.
const (
	// ModeSNP trusts AMD's roots (embedded in go-sev-guest) only.
	ModeSNP = verdict.ModeSNP
	// ModeTDX trusts Intel's SGX/TDX root (embedded in go-tdx-guest) only.
	ModeTDX = verdict.ModeTDX
	// ModeSim trusts the node's simulated secure processor only: SNP-format
	// reports signed by a c8s simulated (test-only) chain.
	ModeSim = verdict.ModeSim
)

// Trust is a node's trust configuration.
type Trust struct {
	Mode Mode
	// SimCertChain is the PEM ASK and ARK of the node's simulated secure
	// processor (simtrust.CertChainFile); required in ModeSim, refused otherwise.
	SimCertChain []byte
	// FetchCertificates lets hardware modes fetch what the evidence lacks
	// over the network: a VCEK from AMD's KDS, collateral and revocation
	// lists from Intel's PCS.
	FetchCertificates bool
	// TDXCollateral, in ModeTDX, is Intel's collateral (LoadTDXCollateral):
	// each quote's platform TCB status, quoting enclave and PCK revocation
	// are judged with it, offline. Without it and without
	// FetchCertificates they are not judged (TDXClaims.TCB is nil).
	TDXCollateral *TDXCollateral
	// PCS, with FetchCertificates in ModeTDX, replaces Intel's PCS.
	PCS *PCSClient
	// Now returns the time certificates must be valid at; nil is time.Now.
	Now func() time.Time
	// AMDCRLs are AMD's certificate revocation lists (DER or PEM, as the
	// KDS serves them at vcek/v1/<product>/crl and vlek/v1/<product>/crl:
	// FetchAMDCRL, LoadAMDCRLs), ModeSNP only. An SNP report whose ASK or
	// ASVK (or, with an intermediate's CRL, whose VCEK or VLEK) one of them
	// revokes is refused; a CRL past its next update fails every report of
	// its product line. With FetchCertificates and no CRL for a product
	// line, the verifier fetches it.
	AMDCRLs [][]byte
	// FetchTimeout bounds each fetch of FetchCertificates; zero is
	// DefaultFetchTimeout. A fetch is not retried: without a network it
	// fails at once, as a KindNetwork error.
	FetchTimeout time.Duration
	// SNPRoots, in ModeSNP only, replaces AMD's roots by another ASK and
	// ARK (PEM, in the order of AMD's KDS cert_chain endpoint) whose ARK is
	// named "ARK-<product line>". It exists for tests with go-sev-guest's
	// fake secure processor, which signs with its own test-only ARK; it is
	// never read from configuration.
	SNPRoots []byte
}

// SimTrust returns the Trust of a sim-mode verifier for the simulated
// secure processor whose state lives in dir (sim.Open).
func SimTrust(dir string) (Trust, error) {
	b, err := os.ReadFile(filepath.Join(dir, simtrust.CertChainFile))
	if err != nil {
		return Trust{}, fmt.Errorf("attest: the node's simulated root: %w", err)
	}
	return Trust{Mode: ModeSim, SimCertChain: b}, nil
}

// intelRootPEM is Intel's SGX Root CA, the root of every TDX PCK chain, as
// Intel publishes it (certificates.trustedservices.intel.com). Passing it
// explicitly keeps go-tdx-guest from logging to stdout that it falls back
// on its embedded copy.
//
//go:embed intel_sgx_root_ca.pem
var intelRootPEM []byte

// intelRootSHA256 is the SHA-256 fingerprint of Intel's SGX Root CA.
const intelRootSHA256 = "44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3"

// intelRoot parses intelRootPEM and checks its fingerprint.
func intelRoot() (*x509.CertPool, error) {
	blk, _ := pem.Decode(intelRootPEM)
	if blk == nil {
		return nil, errors.New("the embedded Intel SGX root is not PEM")
	}
	if sum := sha256.Sum256(blk.Bytes); hex.EncodeToString(sum[:]) != intelRootSHA256 {
		return nil, errors.New("the embedded Intel SGX root has the wrong fingerprint")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the embedded Intel SGX root: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return pool, nil
}

// Verifier verifies evidence against policies with one node's trust
// anchors. It is safe for concurrent use.
type Verifier struct {
	trust    Trust
	snpRoots map[string][]*trust.AMDRootCerts // nil: go-sev-guest's embedded AMD roots
	tdxRoots *x509.CertPool                   // Intel's SGX root (ModeTDX)
	amdCRLs  []*amdCRL                        // Trust.AMDCRLs (ModeSNP)

	mu    sync.Mutex
	vceks map[[sha256.Size]byte]verifiedChain // chains verified before
	// fetched are the CRLs fetched from AMD's KDS (FetchCertificates),
	// by product line and key (fetchedRevocation).
	fetched map[string]fetchedCRL
}

// fetchedCRL is a CRL fetched from AMD's KDS, and when.
type fetchedCRL struct {
	crl *amdCRL
	at  time.Time
}

// maxCachedChains bounds the verified-chain cache (one entry per chip and
// TCB; a node sees one).
const maxCachedChains = 64

// NewVerifier returns a verifier for t.
func NewVerifier(t Trust) (*Verifier, error) {
	v := &Verifier{trust: t, vceks: map[[sha256.Size]byte]verifiedChain{}}
	if len(t.SNPRoots) != 0 && t.Mode != ModeSNP {
		return nil, failure(KindConfig, "trust", fmt.Errorf("mode %s takes no SNP roots", t.Mode), "")
	}
	switch t.Mode {
	case ModeSNP, ModeTDX:
		if len(t.SimCertChain) != 0 {
			return nil, failure(KindConfig, "trust", fmt.Errorf("mode %s trusts the hardware vendor's roots only; a simulated root must not be configured", t.Mode), "")
		}
		if len(t.SNPRoots) != 0 {
			roots, err := snpRootsFromPEM(t.SNPRoots)
			if err != nil {
				return nil, failure(KindConfig, "trust", err, "")
			}
			v.snpRoots = roots
		}
		if t.Mode == ModeTDX {
			pool, err := intelRoot()
			if err != nil {
				return nil, failure(KindConfig, "trust", err, "")
			}
			v.tdxRoots = pool
		}
	case ModeSim:
		if len(t.SimCertChain) == 0 {
			return nil, failure(KindConfig, "trust", errors.New("mode sim needs the node's simulated root (the sim TEE's cert_chain.pem)"), "")
		}
		root := trust.AMDRootCertsProduct(simtrust.ProductLine)
		if err := root.FromKDSCertBytes(t.SimCertChain); err != nil {
			return nil, failure(KindConfig, "trust", fmt.Errorf("simulated root: %w", err), "")
		}
		if root.ProductCerts.Ark == nil || !simtrust.IsSimulated(root.ProductCerts.Ark) || !simtrust.IsSimulated(root.ProductCerts.Ask) {
			return nil, failure(KindConfig, "trust", errors.New("the sim root is not a c8s simulated chain; sim mode never trusts real vendor roots"), "")
		}
		v.snpRoots = map[string][]*trust.AMDRootCerts{simtrust.ProductLine: {root}}
	default:
		return nil, failure(KindConfig, "trust", fmt.Errorf("unknown mode %q: want snp, tdx or sim", t.Mode), "")
	}
	if err := v.initSNP(); err != nil {
		return nil, err
	}
	return v, nil
}

// snpRootsFromPEM parses an ASK and ARK of one of AMD's product lines.
func snpRootsFromPEM(b []byte) (map[string][]*trust.AMDRootCerts, error) {
	var lastErr error
	for _, line := range []string{"Milan", "Genoa", "Turin"} {
		root := trust.AMDRootCertsProduct(line)
		if err := root.FromKDSCertBytes(b); err != nil {
			lastErr = err
			continue
		}
		if root.ProductCerts.Ark == nil || root.ProductCerts.Ark.Subject.CommonName != "ARK-"+line {
			continue
		}
		return map[string][]*trust.AMDRootCerts{line: {root}}, nil
	}
	return nil, fmt.Errorf("SNP roots: not an ASK and ARK of a known product line (Milan, Genoa, Turin): %v", lastErr)
}

// Mode returns the verifier's mode.
func (v *Verifier) Mode() Mode { return v.trust.Mode }

func (v *Verifier) now() time.Time {
	if v.trust.Now != nil {
		return v.trust.Now()
	}
	return time.Now()
}

// verifiedChain is a report key's certificate and the intermediate and
// root its chain verified with.
type verifiedChain struct {
	cert, ica, ark *x509.Certificate
}

// cachedVCEK returns the chain of the key certificate with DER der if it
// verified before and the certificate is still valid, else ok false. The
// chain's revocation is the caller's to judge again: the CRLs may have
// aged past their next update since.
func (v *Verifier) cachedVCEK(der []byte) (c verifiedChain, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	c, ok = v.vceks[sha256.Sum256(der)]
	if !ok {
		return c, false
	}
	if now := v.now(); now.After(c.cert.NotAfter) || now.Before(c.cert.NotBefore) {
		delete(v.vceks, sha256.Sum256(der))
		return verifiedChain{}, false
	}
	return c, true
}

func (v *Verifier) cacheVCEK(c verifiedChain) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.vceks) >= maxCachedChains {
		clear(v.vceks)
	}
	v.vceks[sha256.Sum256(c.cert.Raw)] = c
}
