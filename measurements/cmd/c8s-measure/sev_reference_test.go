package main

// Cross-check against the reference tool virtee/sev-snp-measure on inputs
// that are not in VECTORS.md. The expected outputs in
// testdata/sev-reference.json were produced by running that tool (Python)
// on exactly these arguments and synthetic kernel/initrd files, with
//
//	go test ./measurements/cmd/c8s-measure -run TestSEVReference -update-sev-reference
//
// which needs python3 and a fetched mirror of the tool at
// ../.mirror/virtee+sev-snp-measure (next to the repository). The file
// records the tool's commit. Without the flag, the test compares
// c8s-measure's output with the recorded values.

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/internal/fixtures"
)

var updateSEVReference = flag.Bool("update-sev-reference", false, "regenerate testdata/sev-reference.json by running virtee/sev-snp-measure")

const sevReferenceGolden = "testdata/sev-reference.json"

// sevReferenceCases are reference-tool invocations: mode, then arguments
// with $NAME placeholders for the input files.
var sevReferenceCases = [][]string{
	{"snp", "--ovmf", "$AMD", "--vcpus", "2", "--vcpu-type", "EPYC-v4"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "8", "--vcpu-type", "EPYC-v4", "--kernel", "$KERNEL", "--initrd", "$INITRD", "--append", "console=ttyS0 root=/dev/vda"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "8", "--vcpu-type", "EPYC-Milan", "--kernel", "$KERNEL", "--initrd", "$INITRD", "--append", "console=ttyS0", "--guest-features", "0x5"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "2", "--vcpu-type", "EPYC-Milan-v2", "--guest-features", "0x21"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "3", "--vcpu-type", "EPYC-Genoa", "--kernel", "$KERNEL"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "2", "--vcpu-type", "EPYC-Turin", "--kernel", "$KERNEL", "--initrd", "$INITRD"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "2", "--vcpu-type", "EPYC-Rome-v3", "--kernel", "$KERNEL", "--append", "a b c \u00e9"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "5", "--vcpu-family", "25", "--vcpu-model", "17", "--vcpu-stepping", "1", "--kernel", "$KERNEL"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "5", "--vcpu-sig", "0xa10f11", "--guest-features", "0x3f"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "1", "--vcpu-sig", "0"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "8", "--vmm-type", "ec2", "--kernel", "$KERNEL", "--initrd", "$INITRD"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "2", "--vmm-type", "ec2", "--vcpu-type", "EPYC-v4", "--guest-features", "0xffffffffffffffff"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "8", "--vmm-type", "gce", "--kernel", "$KERNEL", "--initrd", "$INITRD", "--guest-features", "0x21"},
	{"snp", "--ovmf", "$X64", "--vcpus", "2", "--vcpu-type", "EPYC-Milan"},
	{"snp", "--ovmf", "$X64", "--vcpus", "16", "--vcpu-type", "EPYC-Genoa-v1", "--guest-features", "0x21"},
	{"snp", "--ovmf", "$X64", "--vcpus", "8", "--vmm-type", "ec2"},
	{"snp", "--ovmf", "$X64", "--vcpus", "8", "--vmm-type", "gce"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "2", "--vcpu-type", "EPYC-v4", "--snp-ovmf-hash", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", "--kernel", "$KERNEL"},
	{"snp", "--ovmf", "$AMD", "--vcpus", "2", "--vcpu-type", "EPYC-v4", "--output-format", "base64"},
	{"snp:ovmf-hash", "--ovmf", "$SVSM_OVMF"},
	{"snp:ovmf-hash", "--ovmf", "$X64"},
	{"snp:svsm", "--ovmf", "$SVSM_OVMF", "--svsm", "$SVSM", "--vars-size", "540672", "--vcpus", "1", "--vcpu-type", "EPYC-Milan"},
	{"snp:svsm", "--ovmf", "$SVSM_OVMF", "--svsm", "$SVSM", "--vars-size", "131072", "--vcpus", "8", "--vcpu-type", "EPYC-v4"},
	{"snp:svsm", "--ovmf", "$SVSM_OVMF", "--svsm", "$SVSM", "--vars-file", "$VARS", "--vcpus", "3", "--vcpu-sig", "0xa00f11"},
	{"sev", "--ovmf", "$AMD", "--kernel", "$KERNEL", "--initrd", "$INITRD", "--append", "console=ttyS0"},
	{"sev", "--ovmf", "$AMD", "--kernel", "$KERNEL", "--append", ""},
	{"sev", "--ovmf", "$SVSM_OVMF"},
	{"seves", "--ovmf", "$AMD", "--vcpus", "8", "--vcpu-type", "EPYC-Milan", "--kernel", "$KERNEL", "--initrd", "$INITRD", "--append", "x"},
	{"seves", "--ovmf", "$X64", "--vcpus", "2", "--vcpu-type", "EPYC-v4"},
	{"seves", "--ovmf", "$AMD", "--vcpus", "3", "--vmm-type", "ec2", "--kernel", "$KERNEL"},
	{"seves", "--ovmf", "$AMD", "--vcpus", "3", "--vmm-type", "gce"},
}

// sevReferenceFiles writes the synthetic inputs and returns the placeholder
// values. The kernel and initrd are deterministic, multi-MiB and of odd
// sizes; the vars file is 256 KiB (c8s-measure, unlike the reference tool,
// rejects a vars size that would place the SVSM image off a page boundary).
func sevReferenceFiles(t *testing.T) map[string]string {
	dir := fixtures.Dir(t, "snp")
	tmp := t.TempDir()
	write := func(name string, size int, mul byte) string {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(i>>9)*mul + byte(i)
		}
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return map[string]string{
		"$AMD":       filepath.Join(dir, "ovmf_AmdSev_suffix.bin"),
		"$X64":       filepath.Join(dir, "ovmf_OvmfX64_suffix.bin"),
		"$SVSM_OVMF": filepath.Join(dir, "svsm_ovmf.fd"),
		"$SVSM":      filepath.Join(dir, "svsm.bin"),
		"$KERNEL":    write("kernel", 3<<20+123, 3),
		"$INITRD":    write("initrd", 5<<20+7, 5),
		"$VARS":      write("vars", 256<<10, 0),
	}
}

type sevReferenceDoc struct {
	Comment string            `json:"comment"`
	Tool    string            `json:"tool"`
	Results map[string]string `json:"results"`
}

func sevReferenceKey(c []string) string { return strings.Join(c, " ") }

func TestSEVReference(t *testing.T) {
	files := sevReferenceFiles(t)
	expand := func(args []string) []string {
		out := make([]string, len(args))
		for i, a := range args {
			if v, ok := files[a]; ok {
				a = v
			}
			out[i] = a
		}
		return out
	}
	if *updateSEVReference {
		sevUpdateReference(t, expand)
	}
	raw, err := os.ReadFile(sevReferenceGolden)
	if err != nil {
		t.Fatalf("%v (regenerate with -update-sev-reference)", err)
	}
	var doc sevReferenceDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", sevReferenceGolden, err)
	}
	commands := map[string]string{"snp": "snp", "snp:svsm": "snp", "snp:ovmf-hash": "snp-ovmf-hash", "sev": "sev", "seves": "seves"}
	for _, c := range sevReferenceCases {
		key := sevReferenceKey(c)
		want, ok := doc.Results[key]
		if !ok {
			t.Errorf("no reference result for %q (regenerate with -update-sev-reference)", key)
			continue
		}
		got, err := measure(t, commands[c[0]], expand(c[1:])...)
		if err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		if strings.TrimSpace(got) != want {
			t.Errorf("%s:\n got %s\nwant %s (virtee/sev-snp-measure)", key, strings.TrimSpace(got), want)
		}
	}
}

// sevUpdateReference runs the reference tool from a scratch copy of its
// mirror and rewrites the golden file.
func sevUpdateReference(t *testing.T, expand func([]string) []string) {
	wd, _ := os.Getwd()
	root := wd
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		if filepath.Dir(root) == root {
			t.Fatal("no go.mod above the test directory")
		}
		root = filepath.Dir(root)
	}
	mirror := filepath.Join(filepath.Dir(root), ".mirror", "virtee+sev-snp-measure", "repo")
	if _, err := os.Stat(mirror); err != nil {
		t.Fatalf("reference tool not available: %v", err)
	}
	commit, err := exec.Command("git", "--git-dir", mirror, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse in %s: %v", mirror, err)
	}
	ref := t.TempDir()
	archive := exec.Command("sh", "-c", `git --git-dir "$1" archive HEAD | tar -x -C "$2"`, "sh", mirror, ref)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extracting the reference tool: %v\n%s", err, out)
	}
	doc := sevReferenceDoc{
		Comment: "Outputs of virtee/sev-snp-measure run on these arguments by TestSEVReference -update-sev-reference; $KERNEL and $INITRD are the test's synthetic files.",
		Tool:    "github.com/virtee/sev-snp-measure@" + strings.TrimSpace(string(commit)),
		Results: map[string]string{},
	}
	for _, c := range sevReferenceCases {
		args := append([]string{filepath.Join(ref, "sev-snp-measure.py"), "--mode", c[0]}, expand(c[1:])...)
		cmd := exec.Command("python3", args...)
		cmd.Dir = ref
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("reference tool on %q: %v", sevReferenceKey(c), err)
		}
		doc.Results[sevReferenceKey(c)] = strings.TrimSpace(string(out))
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(sevReferenceGolden), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sevReferenceGolden, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "wrote %s from %s\n", sevReferenceGolden, doc.Tool)
}
