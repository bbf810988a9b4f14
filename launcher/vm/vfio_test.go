package vm

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/internal/golden"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
)

// h100 is an H100 SXM5's 64-bit BARs: BAR1 128 GiB and BAR3 32 MiB.
const h100 = 128<<30 + 32<<20

// TestVFIOArgsGolden: the complete argv of a pod VM with one and two
// confidential GPUs, for each TEE, sealed as the packaged configs run.
func TestVFIOArgsGolden(t *testing.T) {
	one := []VFIODevice{{Host: "0000:41:00.0", IOMMUFD: true, Mem64Bytes: h100}}
	two := []VFIODevice{{Host: "0000:41:00.0", IOMMUFD: true, Mem64Bytes: h100}, {Host: "0000:c1:00.0", Mem64Bytes: h100}}
	for _, c := range []struct {
		name, tee, accel string
		devs             []VFIODevice
	}{
		{"sim-gpu1", "sim", "tcg", one},
		{"sim-gpu2", "sim", "tcg", two},
		{"snp-gpu1", "snp", "kvm", one},
		{"snp-gpu2", "snp", "kvm", two},
		{"tdx-gpu1", "tdx", "kvm", one},
		{"tdx-gpu2", "tdx", "kvm", two},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := sealed(goldenSpec(c.tee, c.accel))
			s.VFIO = c.devs
			b, err := tee.Lookup(c.tee)
			if err != nil {
				t.Fatal(err)
			}
			argv, err := Args(s, b)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(argv, "\n") + "\n"
			// The GPUs are all the change: the argv without them is the
			// sealed golden of the TEE.
			s.VFIO = nil
			base, err := Args(s, b)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(got, strings.Join(base, "\n")+"\n") {
				t.Fatalf("the GPU argv does not extend the argv without GPUs:\n%s", got)
			}
			golden.Check(t, c.name, []byte(got))
		})
	}
}

func TestVFIOArgs(t *testing.T) {
	h := goldenSpec("snp", "kvm").Hypervisor
	argv, err := vfioArgs("q35", h, []VFIODevice{{Host: "0000:41:00.0", Mem64Bytes: h100}})
	if err != nil {
		t.Fatal(err)
	}
	want := "-device pcie-root-port,id=c8s-rp0,bus=pcie.0,chassis=1 -device vfio-pci,host=0000:41:00.0,id=c8s-vfio0,bus=c8s-rp0 -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"
	if got := strings.Join(argv, " "); got != want {
		t.Fatalf("argv\n%s\nwant\n%s", got, want)
	}
	// SeaBIOS (sim without firmware) has no such window to size.
	h.Firmware = ""
	argv, _ = vfioArgs("q35", h, []VFIODevice{{Host: "0000:41:00.0", Mem64Bytes: h100}})
	if strings.Contains(strings.Join(argv, " "), "fw_cfg") {
		t.Fatalf("fw_cfg without OVMF: %v", argv)
	}
	for mem, want := range map[uint64]uint64{0: 32 << 10, 16 << 30: 32 << 10, h100: 256 << 10, 2 * (256 << 30): 512 << 10} {
		if got := mmio64MiB(mem); got != want {
			t.Errorf("mmio64MiB(%d) = %d, want %d", mem, got, want)
		}
	}
}

func TestVFIOArgsErrors(t *testing.T) {
	h := goldenSpec("tdx", "kvm").Hypervisor
	for _, c := range []struct {
		name    string
		machine string
		devs    []VFIODevice
		want    string
	}{
		{"pc machine", "pc", []VFIODevice{{Host: "0000:41:00.0"}}, "machine type \"pc\" does not have"},
		{"short address", "q35", []VFIODevice{{Host: "41:00.0"}}, "not a PCI address"},
		{"option injection", "q35", []VFIODevice{{Host: "0000:41:00.0,romfile=/x"}}, "not a PCI address"},
		{"twice", "q35", []VFIODevice{{Host: "0000:41:00.0"}, {Host: "0000:41:00.0"}}, "given twice"},
		{"huge BARs", "q35", []VFIODevice{{Host: "0000:41:00.0", Mem64Bytes: 1 << 60}}, "more than a VM can place"},
		{"too many", "q35", make([]VFIODevice, maxVFIODevices+1), "at most 16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := vfioArgs(c.machine, h, c.devs)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
	// Through Args too.
	s := goldenSpec("sim", "tcg")
	s.VFIO = []VFIODevice{{Host: "bad"}}
	b, _ := tee.Lookup("sim")
	if _, err := Args(s, b); err == nil || !strings.Contains(err.Error(), "not a PCI address") {
		t.Fatalf("Args error %v", err)
	}
}

// TestVFIOArgsAcceptedByQEMU runs the installed QEMU (make deps) with the
// legacy-group GPU arguments on a machine without the device: QEMU takes
// the root port, the vfio-pci properties and the fw_cfg item, and fails
// only where it opens the host device. (Debian 12's QEMU 7.2 has no
// iommufd object; that variant is checked by the golden files only.)
func TestVFIOArgsAcceptedByQEMU(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatalf("qemu-system-x86_64 not found: run make deps")
	}
	h := goldenSpec("snp", "kvm").Hypervisor
	args, err := vfioArgs("q35", h, []VFIODevice{{Host: "0000:41:00.0", Mem64Bytes: h100}, {Host: "0000:c1:00.0", Mem64Bytes: h100}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/sys/bus/pci/devices/0000:41:00.0"); err == nil {
		t.Fatalf("this host has a PCI device 0000:41:00.0: the test needs an address that is not there")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, append([]string{"-machine", "q35", "-accel", "tcg", "-nodefaults", "-display", "none", "-S", "-m", "128"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("QEMU started with a host device that does not exist:\n%s", out)
	}
	want := "-device vfio-pci,host=0000:41:00.0,id=c8s-vfio0,bus=c8s-rp0: vfio /sys/bus/pci/devices/0000:41:00.0: no such host device"
	if !strings.Contains(string(out), want) {
		t.Fatalf("QEMU: %v\n%s\nwant it to fail opening the host device: %s", err, out, want)
	}
}
