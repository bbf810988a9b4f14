package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/igvm"
	"github.com/c8s-dev/c8s/measurements/internal/fixtures"
	"github.com/c8s-dev/c8s/measurements/ovmf"
	"github.com/c8s-dev/c8s/measurements/snp"
)

// TestIGVMFromOVMFMatchesSNP writes IGVM files with --from-ovmf and checks
// that measuring them gives the snp subcommand's digest for the same inputs,
// and the published vector where there is one.
func TestIGVMFromOVMFMatchesSNP(t *testing.T) {
	amd := filepath.Join(fixtures.Dir(t, "snp"), "ovmf_AmdSev_suffix.bin")
	k := sevEmpty(t)
	dir := t.TempDir()
	cases := []struct {
		name     string
		inputs   []string
		vcpus    string
		features string
		want     string
	}{
		{"AmdSev K,C 0x1", []string{"--kernel", k, "--initrd", k, "--append", "console=ttyS0 loglevel=7"}, "1", "0x1",
			"6d287813eb5222d770f75005c664e34c204f385ce832cc2ce7d0d6f354454362f390ef83a92046c042e706363b4b08fa"},
		{"AmdSev K 4 vCPUs 0x21", []string{"--kernel", k, "--initrd", k, "--append", ""}, "4", "0x21",
			"4953b1fb416fa874980e8442b3706d345926d5f38879134e00813c5d7abcbe78eafe7b422907be0b4698e2414a631942"},
		{"AmdSev no kernel 0x1", nil, "1", "0x1",
			"19358ba9a7615534a9a1e2f0dfc29384dcd4dcb7062ff9c6013b26869a5fc6ecabe033c48dd6f6db5d6d76e7c5df632d"},
	}
	if kernels, _ := filepath.Glob("/boot/vmlinuz-*"); len(kernels) > 0 {
		cases = append(cases, struct {
			name     string
			inputs   []string
			vcpus    string
			features string
			want     string
		}{"host kernel " + kernels[0], []string{"--kernel", kernels[0], "--append", "console=ttyS0"}, "2", "0x21", ""})
	} else {
		t.Log("no /boot/vmlinuz-*: the real-kernel case is not run")
	}
	for i, c := range cases {
		out := filepath.Join(dir, c.name[:6]+string(rune('a'+i))+".igvm")
		common := append([]string{"--ovmf", amd, "--vcpus", c.vcpus, "--vcpu-type", "EPYC-v4", "--guest-features", c.features}, c.inputs...)
		written, err := measure(t, "igvm", append([]string{"--from-ovmf", "-o", out}, common...)...)
		if err != nil {
			t.Fatalf("%s: --from-ovmf: %v", c.name, err)
		}
		measured, err := measure(t, "igvm", out)
		if err != nil {
			t.Fatalf("%s: measuring: %v", c.name, err)
		}
		ref, err := measure(t, "snp", common...)
		if err != nil {
			t.Fatalf("%s: snp: %v", c.name, err)
		}
		if written != ref || measured != ref || (c.want != "" && ref != c.want+"\n") {
			t.Errorf("%s: --from-ovmf printed %q, igvm FILE %q, snp %q, published %q", c.name, written, measured, ref, c.want)
		}
	}
}

// igvmFileWithIDBlock writes the AmdSev no-kernel IGVM file with an ID block
// whose LD is the file's digest, or that digest with its last byte flipped.
func igvmFileWithIDBlock(t *testing.T, corrupt bool) (path string, digest snp.Digest) {
	t.Helper()
	fw := readAmdSev(t)
	sig, _ := snp.VCPUTypeSig("EPYC-v4")
	f, err := igvm.FromOVMF(igvm.OVMFBoot{Firmware: fw, VCPUs: 1, VCPUSig: uint64(sig), GuestFeatures: 1})
	if err != nil {
		t.Fatal(err)
	}
	digest, err = snp.LaunchDigestSNP(fw, snp.Params{VCPUs: 1, VCPUSig: uint64(sig), VMM: snp.VMMQEMU, GuestFeatures: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := &igvm.SNPIDBlock{CompatibilityMask: igvm.SNPMask, LD: digest}
	if corrupt {
		id.LD[47] ^= 0xff
	}
	f.Directives = append(f.Directives, id)
	data, err := igvm.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "id.igvm")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, digest
}

func TestIGVMIDBlock(t *testing.T) {
	good, digest := igvmFileWithIDBlock(t, false)
	out, err := measure(t, "igvm", good, "--output-format", "json")
	if err != nil {
		t.Fatalf("matching ID block: %v", err)
	}
	var doc struct {
		Digest  string `json:"digest"`
		VCPUs   int    `json:"vcpus"`
		Policy  string `json:"policy"`
		IDBlock struct {
			LD    string `json:"ld"`
			Match bool   `json:"match"`
		} `json:"id_block"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("json output %q: %v", out, err)
	}
	if doc.Digest != digest.String() || doc.VCPUs != 1 || !doc.IDBlock.Match || doc.IDBlock.LD != digest.String() || doc.Policy != "0x30000" {
		t.Errorf("json = %+v", doc)
	}
	bad, _ := igvmFileWithIDBlock(t, true)
	out, err = measure(t, "igvm", bad)
	if err == nil || !strings.Contains(err.Error(), "does not match the SNP ID block") || out != digest.String()+"\n" {
		t.Errorf("mismatching ID block: printed %q, error %v", out, err)
	}
}

func TestIGVMCommandErrors(t *testing.T) {
	amd := filepath.Join(fixtures.Dir(t, "snp"), "ovmf_AmdSev_suffix.bin")
	notIGVM := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(notIGVM, []byte("not an igvm file at all, just text"), 0o644); err != nil {
		t.Fatal(err)
	}
	good, _ := igvmFileWithIDBlock(t, false)
	cases := []struct {
		args []string
		want string
	}{
		{nil, "exactly one IGVM FILE"},
		{[]string{good, good}, "exactly one IGVM FILE"},
		{[]string{notIGVM}, "not an IGVM file"},
		{[]string{good, "--loader", "xen"}, "unknown loader"},
		{[]string{good, "--zero-pages", "maybe"}, "want native or normal"},
		{[]string{good, "--vcpus", "2"}, "vCPU 1 has no VP context"},
		{[]string{good, "--vcpu-type", "EPYC-v99"}, "--vcpu-type"},
		{[]string{"--from-ovmf", "--ovmf", amd, "--vcpus", "1", "--vcpu-type", "EPYC-v4"}, "needs -o"},
		{[]string{"--from-ovmf", "--ovmf", amd, "--vcpus", "1,2", "--vcpu-type", "EPYC-v4", "-o", "x"}, "one vCPU count"},
		{[]string{"--from-ovmf", "--ovmf", amd, "--vcpus", "1", "--vcpu-type", "EPYC-v4", "--vmm-type", "ec2", "-o", "x"}, "for QEMU"},
		{[]string{"--from-ovmf", "--ovmf", amd, "--vcpus", "1", "-o", "x"}, "--vcpu-type"},
	}
	for _, c := range cases {
		if _, err := measure(t, "igvm", c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("igvm %q: error %v, want %q", c.args, err, c.want)
		}
	}
}

func readAmdSev(t *testing.T) *ovmf.Firmware {
	t.Helper()
	fw, err := ovmf.Parse(fixtures.Read(t, "snp", "ovmf_AmdSev_suffix.bin"))
	if err != nil {
		t.Fatal(err)
	}
	return fw
}
