package tee_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
	_ "github.com/c8s-dev/c8s/launcher/vm/tee/sim" // the sim backend registers itself
)

func TestRegistry(t *testing.T) {
	if got := tee.Names(); !reflect.DeepEqual(got, config.TEENames) {
		t.Fatalf("registered TEEs %v differ from config.TEENames %v", got, config.TEENames)
	}
	for _, n := range tee.Names() {
		b, err := tee.Lookup(n)
		if err != nil || b.Name() != n {
			t.Fatalf("tee.Lookup(%q) = %v, %v", n, b, err)
		}
	}
	_, err := tee.Lookup("sgx")
	if err == nil || !strings.Contains(err.Error(), `"sgx"`) || !strings.Contains(err.Error(), "sim, snp, tdx") {
		t.Fatalf("tee.Lookup(sgx) error = %v, want it to name sgx and list the known TEEs", err)
	}
}

// Every backend fixes its TEE on the kernel command line, and the image
// build measures what KernelParams says: it must be what QEMU gets, with
// or without an IGVM.
func TestKernelParamsNameTheTEE(t *testing.T) {
	if !reflect.DeepEqual(config.TEENames, teeparam.Names) {
		t.Fatalf("config.TEENames %v differ from the TEEs c8s.tee can name %v", config.TEENames, teeparam.Names)
	}
	h := config.Default().Hypervisor
	h.Firmware = "/fw.fd"
	igvm := h
	igvm.Firmware, igvm.IGVM = "", "/snp.igvm"
	for _, n := range tee.Names() {
		b, err := tee.Lookup(n)
		if err != nil {
			t.Fatal(err)
		}
		params := b.KernelParams()
		if got, ok, err := teeparam.FromCmdline(strings.Join(params, " ")); err != nil || !ok || got != n {
			t.Errorf("%s: kernel parameters %q name TEE %q (%v, %v), want %s", n, params, got, ok, err, teeparam.Format(n))
		}
		shapes := []config.Hypervisor{h}
		if n == "snp" {
			shapes = append(shapes, igvm)
		}
		for _, h := range shapes {
			p, err := b.QEMU(h)
			if err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			if !reflect.DeepEqual(p.KernelParams, params) {
				t.Errorf("%s (igvm %q): QEMU's kernel parameters %q, KernelParams() %q", n, h.IGVM, p.KernelParams, params)
			}
		}
	}
}
