package attest

import "fmt"

// vmpl is the VMPL the policy requires of an SNP report's requester.
func (p *Policy) vmpl() int {
	if p.VMPL != nil {
		return *p.VMPL
	}
	return 0
}

// expectedHostData is the HOST_DATA an SNP report must carry: the policy's,
// zero when it has none, nil (unchecked) with AnyHostData.
func (p *Policy) expectedHostData() []byte {
	switch {
	case len(p.HostData) != 0:
		return p.HostData
	case p.AnyHostData:
		return nil
	}
	return make([]byte, snpHostDataSize)
}

// initSNP checks the SNP part of the trust configuration.
func (v *Verifier) initSNP() error {
	if len(v.trust.AMDCRLs) == 0 {
		return nil
	}
	if v.trust.Mode != ModeSNP {
		return failure(KindConfig, "trust", fmt.Errorf("mode %s takes no AMD CRLs", v.trust.Mode), "")
	}
	roots, err := v.snpTrustedRoots()
	if err != nil {
		return err
	}
	v.amdCRLs, err = parseAMDCRLs(v.trust.AMDCRLs, roots)
	return err
}
