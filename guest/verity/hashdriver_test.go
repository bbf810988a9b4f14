package verity

import (
	"os"
	"testing"
)

// The /proc/crypto fixtures (testdata/README.md) are this repository's own
// captures of Debian's 6.12.107 cloud kernel under QEMU 7.2's TCG, after
// `insmod sha256-ssse3.ko`: crypto-tcg with the qemu64 CPU of sim pod VMs
// (no SSSE3: the module refuses to load), crypto-avx2 with `-cpu max`
// (AVX2, no SHA instructions in TCG 7.2).
func TestSelectedHash(t *testing.T) {
	for _, tc := range []struct {
		file, driver, module string
	}{
		{"testdata/crypto-tcg", "sha256-generic", "kernel"},
		{"testdata/crypto-avx2", "sha256-avx2", "sha256_ssse3"},
	} {
		text, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := SelectedHash(text, "sha256")
		if !ok || got.Driver != tc.driver || got.Module != tc.module {
			t.Errorf("%s: SelectedHash(sha256) = %+v, %v; want driver %s of module %s", tc.file, got, ok, tc.driver, tc.module)
		}
	}
}

func TestSelectedHashSkipsWhatTheCryptoAPIWouldNotGive(t *testing.T) {
	const text = `name         : sha256
driver       : sha256-generic
module       : kernel
priority     : 100
selftest     : passed
internal     : no
type         : shash

name         : sha256
driver       : sha256-internal-only
module       : kernel
priority     : 400
selftest     : passed
internal     : yes
type         : shash

name         : sha256
driver       : sha256-failed
module       : broken
priority     : 300
selftest     : failed
internal     : no
type         : shash

name         : sha256
driver       : sha256-cipher
module       : odd
priority     : 350
selftest     : passed
internal     : no
type         : skcipher

name         : sha512
driver       : sha512-fast
module       : kernel
priority     : 500
selftest     : passed
internal     : no
type         : shash

name         : sha256
driver       : sha256-ni
module       : sha256_ssse3
priority     : 250
selftest     : passed
internal     : no
type         : shash
`
	got, ok := SelectedHash([]byte(text), "sha256")
	if !ok || got.Driver != "sha256-ni" || got.Priority != 250 {
		t.Fatalf("SelectedHash = %+v, %v; want sha256-ni at priority 250", got, ok)
	}
	if _, ok := SelectedHash([]byte(text), "sha384"); ok {
		t.Fatal("SelectedHash found a sha384 that /proc/crypto does not list")
	}
	if _, ok := SelectedHash(nil, "sha256"); ok {
		t.Fatal("SelectedHash found something in an empty /proc/crypto")
	}
}
