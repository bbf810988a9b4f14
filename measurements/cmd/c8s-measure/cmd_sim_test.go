package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/sim"
	"github.com/c8s-dev/c8s/measurements/snp"
)

func TestSimCommandMatchesTheLibrary(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fw := make([]byte, 64<<10)
	copy(fw, "firmware")
	kernel, initrd := []byte("a kernel"), []byte("an initrd")
	args := []string{"--firmware", write("bios.bin", fw), "--kernel", write("vmlinuz", kernel),
		"--initrd", write("initrd.img", initrd), "--append", "console=ttyS0", "--vcpu-type", "EPYC-v4", "--vcpus", "2"}
	out, err := measure(t, "sim", args...)
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := snp.VCPUTypeSig("EPYC-v4")
	want, err := sim.LaunchDigest(sim.Params{Firmware: fw, Kernel: snp.NewKernelHashes(kernel, initrd, "console=ttyS0"), VCPUSig: sig}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != want.String() {
		t.Fatalf("c8s-measure sim printed %q, want %s", out, want)
	}
	if _, err := measure(t, "sim", "--firmware", write("bad.bin", []byte("xyz")), "--kernel", write("k", kernel), "--vcpus", "1", "--vcpu-type", "EPYC-v4"); err == nil || !strings.Contains(err.Error(), "multiple of 4 KiB") {
		t.Fatalf("odd-sized firmware: %v", err)
	}
	if _, err := measure(t, "sim", "--firmware", write("b2.bin", fw), "--vcpus", "1", "--vcpu-type", "EPYC-v4"); err == nil || !strings.Contains(err.Error(), "--kernel") {
		t.Fatalf("no kernel: %v", err)
	}
}
