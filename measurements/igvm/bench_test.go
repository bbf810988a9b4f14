package igvm

import (
	"os"
	"testing"

	"github.com/c8s-dev/c8s/measurements/ovmf"
)

// BenchmarkMeasureDebianOVMF parses and measures the IGVM file of Debian's
// 2 MiB OVMF.fd booted with 4 vCPUs: 512 firmware pages, the SEV metadata
// pages and 4 VMSAs.
func BenchmarkMeasureDebianOVMF(b *testing.B) {
	data, err := os.ReadFile("/usr/share/ovmf/OVMF.fd")
	if err != nil {
		b.Skipf("%v (install the ovmf package)", err)
	}
	fw, err := ovmf.Parse(data)
	if err != nil {
		b.Fatal(err)
	}
	file, _, err := WriteOVMF(OVMFBoot{Firmware: fw, VCPUs: 4, VCPUSig: 0x800f12, GuestFeatures: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(file)))
	for b.Loop() {
		f, err := Parse(file)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := SNPLaunchDigest(f, MeasureOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
