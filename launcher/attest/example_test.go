package attest_test

import (
	"crypto/sha512"
	"fmt"

	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// Gating a sim pod: the node's simulated secure processor signs a report
// for the VM's launch measurement, init data digest and the verifier's
// nonce; the verifier checks it against the pod's policy.
func ExampleVerifier_VerifySNP() {
	sp, err := sim.New(sim.DefaultTCB) // on a node: sim.Open(stateDir)
	if err != nil {
		fmt.Println(err)
		return
	}
	v, err := attest.NewVerifier(attest.Trust{Mode: attest.ModeSim, SimCertChain: sp.CertChainPEM()})
	if err != nil {
		fmt.Println(err)
		return
	}
	nonce, err := attest.NewNonce()
	if err != nil {
		fmt.Println(err)
		return
	}
	// The launch digest of a 2-vCPU VM (from measurements/ on a node).
	launched := sha512.Sum384([]byte("firmware, kernel, initrd, cmdline, 2 vCPUs"))
	req := sim.Request{Measurement: launched}
	copy(req.ReportData[:], nonce) // the guest puts the nonce into REPORT_DATA
	report, err := sp.Report(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	policy := &attest.Policy{
		Measurements: map[int]attest.Hex{2: launched[:]},
		VCPUs:        2,
		Nonce:        nonce,
	}
	claims, err := v.VerifySNP(report, sp.CertTable(), policy)
	fmt.Println(claims.VCPUs, claims.Simulated, err)

	// A VM started with another initrd has another measurement.
	req.Measurement = sha512.Sum384([]byte("firmware, kernel, another initrd, cmdline, 2 vCPUs"))
	report, _ = sp.Report(req)
	_, err = v.VerifySNP(report, sp.CertTable(), policy)
	fmt.Println(err.(*attest.Error).Field, err.(*attest.Error).Kind)
	// Output:
	// 2 true <nil>
	// measurement mismatch
}
