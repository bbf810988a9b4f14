package main

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/internal/fixtures"
)

// sevEmpty returns the path of an empty file ("K" in VECTORS.md).
func sevEmpty(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSNPCommandVectors(t *testing.T) {
	dir := fixtures.Dir(t, "snp")
	amd := filepath.Join(dir, "ovmf_AmdSev_suffix.bin")
	k := sevEmpty(t)
	// VECTORS.md: AmdSev, K, C, features 0x21, 1 vCPU.
	out, err := measure(t, "snp", "--ovmf", amd, "--vcpus", "1", "--vcpu-type", "EPYC-v4",
		"--kernel", k, "--initrd", k, "--append", "console=ttyS0 loglevel=7", "--guest-features", "0x21")
	if err != nil {
		t.Fatal(err)
	}
	if want := "803f691094946e42068aaa3a8f9e26a5c89f36f7b73ecfb28c653360fe4b3aba7e534442e7e1e17895dfe778d0228977\n"; out != want {
		t.Errorf("snp output %q, want the digest alone: %q", out, want)
	}

	// A vCPU set prints a table, one line per count, sorted and unique.
	out, err = measure(t, "snp", "--ovmf", amd, "--vcpus", "4,1-2,1", "--vcpu-type", "EPYC-v4",
		"--kernel", k, "--initrd", k, "--append", "", "--guest-features", "0x21")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "VCPUS") {
		t.Fatalf("table = %q", out)
	}
	if f := strings.Fields(lines[1]); f[0] != "1" || f[1] != "329c8ce0972ae52343b64d34a434a86f245dfd74f5ed7aae15d22efc78fb9683632b9b50e4e1d7fa41179ef98a7ef198" {
		t.Errorf("1-vCPU row %q", lines[1])
	}
	if f := strings.Fields(lines[3]); f[0] != "4" || f[1] != "4953b1fb416fa874980e8442b3706d345926d5f38879134e00813c5d7abcbe78eafe7b422907be0b4698e2414a631942" {
		t.Errorf("4-vCPU row %q", lines[3])
	}

	// JSON.
	out, err = measure(t, "snp", "--ovmf", amd, "--vcpus", "1-4", "--vmm-type", "gce",
		"--kernel", k, "--initrd", k, "--append", "", "--output-format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Mode         string
		Measurements []struct {
			VCPUs  int
			Digest string
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("json output %q: %v", out, err)
	}
	if doc.Mode != "snp" || len(doc.Measurements) != 4 || doc.Measurements[3].VCPUs != 4 ||
		doc.Measurements[3].Digest != "5c5debf100fc339f90276e761ee1f1658d08922c3b20e2a2e6c7a6c3370b2452a15a00eae11886a93d6fd1e7ab81e29d" ||
		doc.Measurements[0].Digest != "5da7106cf14cf46b1725ebab123eb9e53bd46a1e9f400cd0c08e7827b04b688ea8b4e403c8404efed4397ea5d5d0722e" {
		t.Errorf("json = %+v", doc)
	}

	// base64, EC2, no vCPU type needed.
	out, err = measure(t, "snp", "--ovmf", amd, "--vcpus", "1", "--vmm-type", "ec2",
		"--kernel", k, "--initrd", k, "--append", "", "--output-format", "base64")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out))
	if err != nil || hex.EncodeToString(raw) != "0883bd0eeb716e65b7b977a321c278d1e51b33b5c655fab985443bbcc65c086b9c15e8a0bd8811050dec7e24964e5056" {
		t.Errorf("base64 output %q (%v)", out, err)
	}
}

func TestSNPOVMFHashCommand(t *testing.T) {
	dir := fixtures.Dir(t, "snp")
	amd := filepath.Join(dir, "ovmf_AmdSev_suffix.bin")
	const want = "086e2e9149ebf45abdc3445fba5b2da8270bdbb04094d7a2c37faaa4b24af3aa16aff8c374c2a55c467a50da6d466b74"
	out, err := measure(t, "snp-ovmf-hash", "--ovmf", amd)
	if err != nil || strings.TrimSpace(out) != want {
		t.Fatalf("snp-ovmf-hash = %q, %v; want %s", out, err, want)
	}
	// The hash as a seed: the firmware's bytes are then not measured, so a
	// different firmware file with the same metadata gives the same digest.
	k := sevEmpty(t)
	args := []string{"--vcpus", "4", "--vcpu-type", "EPYC-v4", "--kernel", k, "--initrd", k, "--append", "", "--guest-features", "0x21"}
	seeded, err := measure(t, "snp", append([]string{"--ovmf", amd, "--snp-ovmf-hash", want}, args...)...)
	if err != nil || strings.TrimSpace(seeded) != "4953b1fb416fa874980e8442b3706d345926d5f38879134e00813c5d7abcbe78eafe7b422907be0b4698e2414a631942" {
		t.Errorf("seeded snp = %q, %v", seeded, err)
	}
	if _, err := measure(t, "snp", append([]string{"--ovmf", amd, "--snp-ovmf-hash", "abcd"}, args...)...); err == nil || !strings.Contains(err.Error(), "--snp-ovmf-hash") {
		t.Errorf("short seed: %v", err)
	}
}

func TestSVSMCommand(t *testing.T) {
	dir := fixtures.Dir(t, "snp")
	ovmfPath, svsm := filepath.Join(dir, "svsm_ovmf.fd"), filepath.Join(dir, "svsm.bin")
	out, err := measure(t, "snp", "--ovmf", ovmfPath, "--svsm", svsm, "--vars-size", "540672", "--vcpus", "2,4", "--vcpu-type", "EPYC-v4")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"2      9b94745036aafddf4f7f8b00c7513abb5b7703178cb95aaa57928bd963d68d3bfcb715d6019b9167ee2517b11b0d9be7",
		"4      27d154c27b7b359c935e250ec6fee72aa0ae8c1225e3b0e1cf46a9567e938066d7d6f94bbdc4a857818bdb79277a44b2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("svsm table %q lacks %q", out, want)
		}
	}
	// --vars-file takes the size of a file.
	vars := filepath.Join(t.TempDir(), "vars")
	if err := os.WriteFile(vars, make([]byte, 540672), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = measure(t, "snp", "--ovmf", ovmfPath, "--svsm", svsm, "--vars-file", vars, "--vcpus", "2", "--vcpu-type", "EPYC-v4")
	if err != nil || strings.TrimSpace(out) != "9b94745036aafddf4f7f8b00c7513abb5b7703178cb95aaa57928bd963d68d3bfcb715d6019b9167ee2517b11b0d9be7" {
		t.Errorf("--vars-file: %q, %v", out, err)
	}
}

func TestSEVCommands(t *testing.T) {
	dir := fixtures.Dir(t, "snp")
	amd, x64 := filepath.Join(dir, "ovmf_AmdSev_suffix.bin"), filepath.Join(dir, "ovmf_OvmfX64_suffix.bin")
	k := sevEmpty(t)
	out, err := measure(t, "sev", "--ovmf", amd, "--kernel", k, "--initrd", k, "--append", "console=ttyS0 loglevel=7")
	if err != nil || strings.TrimSpace(out) != "82a3ee5d537c3620628270c292ae30cb40c3c878666a7890ee7ef2a08fb535ff" {
		t.Errorf("sev = %q, %v", out, err)
	}
	out, err = measure(t, "sev", "--ovmf", x64)
	if err != nil || strings.TrimSpace(out) != "b4c021e085fb83ceffe6571a3d357b4a98773c83c474e47f76c876708fe316da" {
		t.Errorf("sev OvmfX64 = %q, %v", out, err)
	}
	out, err = measure(t, "seves", "--ovmf", amd, "--vcpus", "4", "--vcpu-type", "EPYC-v4", "--kernel", k, "--initrd", k, "--append", "")
	if err != nil || strings.TrimSpace(out) != "0dccbcaba8e90b261bd0d2e1863a2f9da714768b7b2a19363cd6ae35aa90de91" {
		t.Errorf("seves = %q, %v", out, err)
	}
	out, err = measure(t, "seves", "--ovmf", amd, "--vcpus", "1", "--vcpu-type", "EPYC-v4", "--kernel", k, "--initrd", k, "-v")
	if err != nil || strings.TrimSpace(out) != "Calculated SEV_ES guest measurement: 13810ae661ea11e2bb205621f582fee268f0367c8f97bc297b7fadef3e12002c" {
		t.Errorf("seves -v = %q, %v", out, err)
	}
}

// TestSEVIgnoredFlags checks that flags the reference tool accepts but
// ignores in a mode are accepted with a warning and change nothing.
func TestSEVIgnoredFlags(t *testing.T) {
	dir := fixtures.Dir(t, "snp")
	amd := filepath.Join(dir, "ovmf_AmdSev_suffix.bin")
	k := sevEmpty(t)
	out, warn, err := measureWarn(runSEV, "--ovmf", amd, "--vcpus", "4", "--vcpu-type", "EPYC-v4", "--kernel", k, "--initrd", k, "--append", "console=ttyS0 loglevel=7")
	if err != nil || strings.TrimSpace(out) != "82a3ee5d537c3620628270c292ae30cb40c3c878666a7890ee7ef2a08fb535ff" {
		t.Errorf("sev with --vcpus = %q, %v", out, err)
	}
	if !strings.Contains(warn, "ignoring --vcpus") || !strings.Contains(warn, "ignoring --vcpu-type") {
		t.Errorf("warnings %q", warn)
	}
	out, warn, err = measureWarn(runSEVES, "--ovmf", amd, "--vcpus", "4", "--vcpu-type", "EPYC-v4", "--kernel", k, "--initrd", k, "--guest-features", "0x21")
	if err != nil || strings.TrimSpace(out) != "0dccbcaba8e90b261bd0d2e1863a2f9da714768b7b2a19363cd6ae35aa90de91" {
		t.Errorf("seves with --guest-features = %q, %v", out, err)
	}
	if !strings.Contains(warn, "ignoring --guest-features") {
		t.Errorf("warnings %q", warn)
	}
	// Without ignored flags, nothing is printed to stderr.
	if _, warn, err = measureWarn(runSEV, "--ovmf", amd); err != nil || warn != "" {
		t.Errorf("sev without ignored flags: warnings %q, %v", warn, err)
	}
}

func TestSEVCommandErrors(t *testing.T) {
	dir := fixtures.Dir(t, "snp")
	amd, x64 := filepath.Join(dir, "ovmf_AmdSev_suffix.bin"), filepath.Join(dir, "ovmf_OvmfX64_suffix.bin")
	svsmOVMF, svsm := filepath.Join(dir, "svsm_ovmf.fd"), filepath.Join(dir, "svsm.bin")
	k := sevEmpty(t)
	tmp := t.TempDir()
	truncated := filepath.Join(tmp, "truncated.fd")
	data, err := os.ReadFile(amd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(truncated, data[:len(data)-100], 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cmd  string
		args []string
		want string
	}{
		{"OvmfX64 with kernel", "snp", []string{"--ovmf", x64, "--vcpus", "1", "--vcpu-type", "EPYC-v4", "--kernel", k}, "kernel given but this firmware has no SNP_KERNEL_HASHES section"},
		{"OvmfX64 with kernel, SEV", "sev", []string{"--ovmf", x64, "--kernel", k}, "no SEV hash table"},
		{"no --ovmf", "snp", []string{"--vcpus", "1"}, "--ovmf PATH is required"},
		{"no --vcpus", "snp", []string{"--ovmf", amd, "--vcpu-type", "EPYC-v4"}, "--vcpus N is required"},
		{"no vCPU type", "snp", []string{"--ovmf", amd, "--vcpus", "1"}, "missing --vcpu-type"},
		{"bad vCPU type", "snp", []string{"--ovmf", amd, "--vcpus", "1", "--vcpu-type", "EPYC-v9"}, "unknown vCPU type"},
		{"family without model", "snp", []string{"--ovmf", amd, "--vcpus", "1", "--vcpu-family", "25"}, "--vcpu-model"},
		{"bad vcpus", "snp", []string{"--ovmf", amd, "--vcpus", "4-2", "--vcpu-type", "EPYC-v4"}, "not a vCPU count"},
		{"zero vcpus", "snp", []string{"--ovmf", amd, "--vcpus", "0", "--vcpu-type", "EPYC-v4"}, "not a vCPU count"},
		{"bad vmm", "snp", []string{"--ovmf", amd, "--vcpus", "1", "--vmm-type", "xen"}, "unknown VMM type"},
		{"bad features", "snp", []string{"--ovmf", amd, "--vcpus", "1", "--vcpu-type", "EPYC-v4", "--guest-features", "lots"}, "--guest-features"},
		{"initrd without kernel", "snp", []string{"--ovmf", amd, "--vcpus", "1", "--vcpu-type", "EPYC-v4", "--initrd", k}, "need --kernel"},
		{"bad output format", "sev", []string{"--ovmf", amd, "--output-format", "yaml"}, "--output-format"},
		{"missing file", "sev", []string{"--ovmf", filepath.Join(tmp, "nope.fd")}, "no such file"},
		{"truncated firmware", "snp", []string{"--ovmf", truncated, "--vcpus", "1", "--vcpu-type", "EPYC-v4"}, "no OVMF footer table"},
		{"svsm without vars", "snp", []string{"--ovmf", svsmOVMF, "--svsm", svsm, "--vcpus", "1", "--vcpu-type", "EPYC-v4"}, "--vars-size or --vars-file"},
		{"vars without svsm", "snp", []string{"--ovmf", svsmOVMF, "--vars-size", "4096", "--vcpus", "1", "--vcpu-type", "EPYC-v4"}, "need --svsm"},
		{"svsm on ec2", "snp", []string{"--ovmf", svsmOVMF, "--svsm", svsm, "--vars-size", "540672", "--vcpus", "1", "--vmm-type", "ec2"}, "only defined for QEMU"},
		{"svsm with features", "snp", []string{"--ovmf", svsmOVMF, "--svsm", svsm, "--vars-size", "540672", "--vcpus", "1", "--vcpu-type", "EPYC-v4", "--guest-features", "0x21"}, "always uses"},
		{"svsm image is not an SVSM", "snp", []string{"--ovmf", svsmOVMF, "--svsm", amd, "--vars-size", "540672", "--vcpus", "1", "--vcpu-type", "EPYC-v4"}, "SVSM_INFO"},
		{"stray argument", "sev", []string{"--ovmf", amd, "extra"}, "unexpected argument"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := measure(t, c.cmd, c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
			if out != "" {
				t.Errorf("printed %q on error", out)
			}
		})
	}
}
