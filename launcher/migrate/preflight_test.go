package migrate

import (
	"errors"
	"strings"
	"testing"
)

func TestPreflight(t *testing.T) {
	src := NodeInfo{Name: "a", TrustPool: "p1", TEE: "sim", TCB: 0x0300000000000102, Images: map[string]string{"kernel": "k1", "initrd": "i1"}}
	ok := NodeInfo{Name: "b", TrustPool: "p1", TEE: "sim", TCB: src.TCB, Images: map[string]string{"kernel": "k1", "initrd": "i1"}, MemoryAvailableMiB: 4096, CPUs: 4}
	shape := Shape{VCPUs: 2, MemoryMiB: 512}
	if err := Preflight(src, ok, shape, src.TCB); err != nil {
		t.Fatalf("Preflight to a matching node: %v", err)
	}
	bad := NodeInfo{Name: "c", TrustPool: "p2", TEE: "snp", TCB: 0x0100000000000101, Images: map[string]string{"kernel": "k2"}, MemoryAvailableMiB: 256, CPUs: 1}
	err := Preflight(src, bad, shape, src.TCB)
	var ref *Refusal
	if !errors.As(err, &ref) || ref.Destination != "c" {
		t.Fatalf("Preflight = %v, want a *Refusal for c", err)
	}
	for _, want := range []string{`trust pool "p2"`, "runs TEE snp", "TCB 0x100000000000101 is below", "256 MiB of memory available", "1 CPUs", "guest initrd has digest none", "guest kernel has digest k2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if len(ref.Reasons) != 7 {
		t.Errorf("%d reasons, want 7: %q", len(ref.Reasons), ref.Reasons)
	}
	// A sealed image's root hash is part of the image.
	src.Images["rootfs"], ok.Images["rootfs"] = "r1", "r2"
	if err := Preflight(src, ok, shape, src.TCB); err == nil || !strings.Contains(err.Error(), "guest rootfs has digest r2, the pod's is r1") {
		t.Errorf("Preflight to a node with another verity root: %v", err)
	}
}

func TestCheckTEESupport(t *testing.T) {
	if err := CheckTEESupport("sim", "7.2.0", nil); err != nil {
		t.Fatalf("sim: %v", err)
	}
	for _, tee := range []string{"snp", "tdx"} {
		err := CheckTEESupport(tee, "7.2.0", []string{"xbzrle", "events"})
		if err == nil || !strings.Contains(err.Error(), "QEMU 7.2.0 does not report live-migration support for "+tee) {
			t.Errorf("%s: %v; want a refusal", tee, err)
		}
	}
	CVMMigrationCapability["snp"] = "x-test-snp-migration"
	defer delete(CVMMigrationCapability, "snp")
	if err := CheckTEESupport("snp", "99", []string{"x-test-snp-migration"}); err != nil {
		t.Fatalf("snp with the registered capability: %v", err)
	}
}
