package discovery

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
)

func gpuByAddr(t *testing.T, info GPUInfo, addr string) GPU {
	t.Helper()
	for _, g := range info.GPUs {
		if g.Address == addr {
			return g
		}
	}
	t.Fatalf("no GPU %s among %+v", addr, info.GPUs)
	return GPU{}
}

func TestGPUHost(t *testing.T) {
	r := discover(t, "gpu-host", Options{})
	g := r.GPU
	if !g.IOMMUFD || g.CCModeFile != DefaultGPUCCModeFile || g.CCModeError != "" {
		t.Fatalf("iommufd %v, CC mode file %q (%s)", g.IOMMUFD, g.CCModeFile, g.CCModeError)
	}
	// The bridge, the audio function and the NVSwitch are not GPUs.
	var addrs []string
	for _, x := range g.GPUs {
		addrs = append(addrs, x.Address)
	}
	want := []string{"0000:21:00.0", "0000:41:00.0", "0000:61:00.0", "0000:81:00.0", "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0"}
	if !reflect.DeepEqual(addrs, want) {
		t.Fatalf("GPUs %v, want %v", addrs, want)
	}

	sxm := gpuByAddr(t, g, "0000:41:00.0")
	if !sxm.Usable || sxm.Product != "H100 SXM5 80GB" || sxm.Arch != "hopper" || sxm.CCMode != CCModeOn ||
		sxm.Driver != DriverVFIO || sxm.IOMMUGroup != 40 || sxm.GroupDev != "/dev/vfio/40" || sxm.CDev != "/dev/vfio/devices/vfio0" ||
		!sxm.PCIe || !sxm.FLR || !reflect.DeepEqual(sxm.ExtCaps, []string{"AER", "ResizableBAR", "ATS"}) ||
		!reflect.DeepEqual(sxm.GroupDevices, []string{"0000:00:01.1", "0000:41:00.0"}) || !reflect.DeepEqual(sxm.ResetMethods, []string{"flr", "bus"}) {
		t.Fatalf("H100 SXM5: %+v", sxm)
	}
	if !strings.Contains(sxm.Reason, "iommufd and /dev/vfio/devices/vfio0") {
		t.Fatalf("reason %q", sxm.Reason)
	}
	if got := sxm.Mem64Bytes(); got != 128<<30+32<<20 {
		t.Fatalf("64-bit BARs %d bytes, want 128 GiB + 32 MiB", got)
	}
	if len(sxm.BARs) != 3 || sxm.BARs[0] != (BAR{Index: 0, Size: 16 << 20}) || sxm.BARs[1] != (BAR{Index: 1, Size: 128 << 30, Mem64: true, Prefetch: true}) {
		t.Fatalf("BARs %+v", sxm.BARs)
	}

	pcie := gpuByAddr(t, g, "0000:c1:00.0")
	if !pcie.Usable || pcie.Product != "H100 PCIe" || pcie.CDev != "" || pcie.GroupDev != "/dev/vfio/41" ||
		!strings.Contains(pcie.Reason, "VFIO group /dev/vfio/41") || !strings.Contains(pcie.Reason, "no reset method known") {
		t.Fatalf("H100 PCIe: %+v", pcie)
	}

	for addr, why := range map[string]string{
		"0000:81:00.0": "its CC mode is off",
		"0000:61:00.0": "bound to nvidia, not vfio-pci",
		"0000:a1:00.0": "device ID 20b0 is not a confidential-computing capable GPU",
		"0000:e1:00.0": "IOMMU group 44 is not viable: 0000:e1:00.1 is bound to snd_hda_intel",
		"0000:21:00.0": "in no IOMMU group",
	} {
		x := gpuByAddr(t, g, addr)
		if x.Usable || !strings.Contains(x.Reason, why) {
			t.Errorf("%s: usable %v, reason %q, want it unusable for %q", addr, x.Usable, x.Reason, why)
		}
	}
	if u := g.Usable(); len(u) != 2 || u[0].Address != "0000:41:00.0" || u[1].Address != "0000:c1:00.0" {
		t.Fatalf("usable GPUs %+v", u)
	}
}

func TestGPUCCModeFile(t *testing.T) {
	// Without the file no GPU is in CC mode, whatever else holds.
	r := discover(t, "gpu-host", Options{GPUCCModeFile: "/etc/c8s/none"})
	if len(r.GPU.Usable()) != 0 || r.GPU.CCModeFile != "" {
		t.Fatalf("usable without a CC mode file: %+v", r.GPU)
	}
	if x := gpuByAddr(t, r.GPU, "0000:41:00.0"); !strings.Contains(x.Reason, "there is no CC mode file") {
		t.Fatalf("reason %q", x.Reason)
	}

	for name, body := range map[string]string{
		"bad mode":  "0000:41:00.0 maybe\n",
		"bad addr":  "41:00.0 on\n",
		"twice":     "0000:41:00.0 on\n0000:41:00.0 off\n",
		"one field": "0000:41:00.0\n",
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if err := gpuFixtures["gpu-one"](root); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "etc/c8s/gpu-cc-modes"), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := Discover(Options{Root: root})
			if err != nil {
				t.Fatal(err)
			}
			if r.GPU.CCModeError == "" || len(r.GPU.Usable()) != 0 {
				t.Fatalf("a broken CC mode file was accepted: %+v", r.GPU)
			}
			if x := r.GPU.GPUs[0]; !strings.Contains(x.Reason, "is unreadable") {
				t.Fatalf("reason %q", x.Reason)
			}
		})
	}
}

func TestGPUConfigSpaceChecks(t *testing.T) {
	for name, c := range map[string]struct {
		off  int
		val  byte
		want string
	}{
		"not PCIe":       {0x78, 0x09, "no PCI Express capability"}, // vendor-specific instead
		"ID mismatch":    {cfgDevice, 0x31, "config space says 10de:2331"},
		"broken caplist": {0x79, 0x60, "capability list broken"}, // back to the first: a loop
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			d := gpuDev("0000:41:00.0", 0x2330, DriverVFIO, 40, "")
			if err := writeFixture(root, []fixtureDev{d}, map[string]string{"etc/c8s/gpu-cc-modes": "0000:41:00.0 on\n"}); err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(root, pciDevices, d.addr, "config")
			b, err := os.ReadFile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			b[c.off] = c.val
			if err := os.WriteFile(cfg, b, 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := Discover(Options{Root: root})
			if err != nil {
				t.Fatal(err)
			}
			if x := r.GPU.GPUs[0]; x.Usable || !strings.Contains(x.Reason, c.want) {
				t.Fatalf("usable %v, reason %q, want %q", x.Usable, x.Reason, c.want)
			}
		})
	}
}

func TestParsePCIConfigExtended(t *testing.T) {
	d := gpuDev("0000:41:00.0", 0x2901, DriverVFIO, 1, "")
	d.extCaps = []uint16{0x0001, 0x002e, 0x0030, 0x0023, 0x0999}
	c, err := parsePCIConfig(fixtureConfig(d))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Extended || !reflect.DeepEqual(c.ExtCaps, []string{"AER", "DOE", "IDE", "DVSEC"}) {
		t.Fatalf("%+v", c)
	}
	// 256 bytes (an unprivileged read of sysfs config): no extended space.
	c, err = parsePCIConfig(fixtureConfig(d)[:256])
	if err != nil || c.Extended || !c.PCIe || len(c.ExtCaps) != 0 {
		t.Fatalf("%+v %v", c, err)
	}
	if _, err := parsePCIConfig(make([]byte, 10)); err == nil {
		t.Fatal("a 10-byte config space parsed")
	}
}

func TestPlainHostHasNoGPUs(t *testing.T) {
	r := discover(t, "plain-host", Options{})
	if len(r.GPU.GPUs) != 0 || r.GPU.IOMMUFD {
		t.Fatalf("%+v", r.GPU)
	}
}

func TestConfigOptionsGPUCCModeFile(t *testing.T) {
	c := config.Default()
	c.Devices.GPUCCModes = "/etc/site/cc-modes"
	if o := ConfigOptions(&c); o.GPUCCModeFile != "/etc/site/cc-modes" {
		t.Fatalf("GPUCCModeFile %q", o.GPUCCModeFile)
	}
}
