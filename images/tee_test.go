package images

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
	"github.com/c8s-dev/c8s/manifest"
)

// recordedCmdline returns the command line the manifest's digests of TEE
// name are over.
func recordedCmdline(m *manifest.Manifest, name string) (string, error) {
	switch name {
	case "sim":
		d, err := m.Sim()
		if err != nil {
			return "", err
		}
		return d.Cmdline, nil
	case "snp":
		d, err := m.SNP()
		if err != nil {
			return "", err
		}
		return d.Cmdline, nil
	default:
		d, err := m.TDX()
		if err != nil {
			return "", err
		}
		return d.Cmdline, nil
	}
}

// TestSealedCmdlinePerTEE checks that each TEE's digests in the built
// manifest are over the very command line the launcher gives a pod VM of
// that TEE from this image (no hypervisor.kernel_params): the common
// command line, the root's verity parameters and the TEE's c8s.tee. A
// mismatch fails every pod's attestation.
func TestSealedCmdlinePerTEE(t *testing.T) {
	dir := imageDir(t)
	m, err := manifest.Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range tee.Names() {
		got, err := recordedCmdline(m, name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		b, err := tee.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		h := config.Default().Hypervisor
		h.TEE, h.Kernel, h.Initrd, h.Firmware = name, "/vmlinuz", "/initrd.img", "/firmware.fd"
		spec := vm.Spec{ID: "cmdline", StateDir: "/run/c8s/cmdline", Hypervisor: h, Accel: "kvm",
			Root: &vm.RootDisk{Path: filepath.Join(dir, "rootfs.img"), KernelParams: m.RootKernelParams(), RootHash: m.Verity.RootHash}}
		argv, err := vm.Args(spec, b)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.Index(argv, "-append")
		if i < 0 || i+1 >= len(argv) {
			t.Fatalf("%s: no -append in %q", name, argv)
		}
		if want := argv[i+1]; got != want {
			t.Errorf("%s: the manifest's digests are over\n\t%q\nbut the launcher boots\n\t%q", name, got, want)
		}
		if want := m.Cmdline + " " + strings.Join(b.KernelParams(), " "); got != want {
			t.Errorf("%s: digests.%s.cmdline %q is not the common cmdline followed by the TEE's parameters (%q)", name, name, got, want)
		}
	}
}
