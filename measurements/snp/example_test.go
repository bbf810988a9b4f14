package snp_test

import (
	"fmt"
	"strings"

	"github.com/c8s-dev/c8s/measurements/snp"
)

// Building a launch digest page by page, as an IGVM loader does. The
// result is google/gce-tcb-verifier's published vector for three normal
// pages at GPA 0 with "LGTM"x4 at the start and at the end.
func ExampleLaunchDigest() {
	data := make([]byte, 3*snp.PageSize)
	lgtm := strings.Repeat("LGTM", 4)
	copy(data, lgtm)
	copy(data[len(data)-len(lgtm):], lgtm)

	ld := snp.NewLaunchDigest()
	for gpa := 0; gpa < len(data); gpa += snp.PageSize {
		if err := ld.UpdatePage(snp.PageNormal, uint64(gpa), data[gpa:gpa+snp.PageSize]); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println(ld.Digest())
	// Output: cba1cd767c33b30f96271837dbbae4081a945464a5af397b9b0336b5d8759ee88cc6b62c05d915c4424a9ac5747437d4
}

// A QEMU vCPU model's signature, as QEMU puts it in RDX at reset.
func ExampleVCPUTypeSig() {
	sig, err := snp.VCPUTypeSig("EPYC-Milan")
	fmt.Printf("%#x %v\n", sig, err)
	// Output: 0xa00f11 <nil>
}
